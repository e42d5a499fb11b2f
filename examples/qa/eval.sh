#!/usr/bin/env bash
# Answer the questions of a binarised split with a trained checkpoint, write the official prediction file and print
# EM / F1 (Natural Questions data: long / short answer F1 of every answer and at the best score threshold, as
# nq_eval.py reports them).
#   bash examples/qa/eval.sh DATA_BIN CHECKPOINT [SPLIT (default valid)] [OUTPUT (default CHECKPOINT_DIR/SPLIT.pred.json)]
# Environment: MAX_CONTEXT_EVAL (default: the checkpoint's, 10,000 for the paper's settings), BATCH (default 4),
#   NQ_THRESHOLD (Natural Questions: non-null annotations that make the gold answered; default 2, nq_eval.py's rule
#   for the 5-way annotated dev set; 1 for a split of the single-annotated training set).
set -euo pipefail

if (($# < 2)) || [[ "$1" == -h || "$1" == --help ]]; then
    sed -n '2,/^[^#]/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
    exit $(($# < 2 ? 2 : 0))
fi
# shellcheck source=../recipe_args.sh
source "$(dirname "$0")/../recipe_args.sh"
recipe_env int MAX_CONTEXT_EVAL BATCH NQ_THRESHOLD
DATA="$1" CHECKPOINT="$2" SPLIT="${3:-valid}"
OUTPUT="${4:-$(dirname "$CHECKPOINT")/$SPLIT.pred.json}"
FLAGS=(--split "$SPLIT" --output "$OUTPUT" --batch-size "${BATCH:-4}" --nq-threshold "${NQ_THRESHOLD:-2}")
[[ -n "${MAX_CONTEXT_EVAL:-}" ]] && FLAGS+=(--max-context-eval "$MAX_CONTEXT_EVAL")
fairseq-clusterformer-qa-predict "$DATA" --path "$CHECKPOINT" "${FLAGS[@]}" | grep '^|'
