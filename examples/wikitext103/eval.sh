#!/usr/bin/env bash
# Score a trained WikiText-103 model with fairseq-eval-lm; the last line printed is the perplexity.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: examples/wikitext103/eval.sh [--small] CHECKPOINT [DATA_BIN]

Runs fairseq-eval-lm on the test split of DATA_BIN (default data-bin/wikitext-103) with CHECKPOINT (e.g.
checkpoints/wikitext103-cluster-512c-strict/checkpoint_best.pt) and prints "perplexity: <value>" as its last line.
Segments of TOKENS tokens, each scoring only the tokens after its first CONTEXT_WINDOW (fairseq's --context-window).

  --small     the sizes of train.sh --small (1,024-token segments, context 512)
  -h, --help  this text

Environment (defaults: paper / --small): TOKENS=3072/1024 (must equal training's --tokens-per-sample),
CONTEXT_WINDOW=2560/512, MAX_TOKENS=3072/4096, SUBSET=test, SOFTMAX_BATCH=1024, LOG (default: eval-<subset>.log
beside the checkpoint), EXTRA_ARGS.
USAGE
}

die() { echo "eval.sh: $*" >&2; exit 2; }

small=0 positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --small) small=1; shift ;;
    -*) usage >&2; die "unknown option: $1" ;;
    *) positional+=("$1"); shift ;;
  esac
done
[ ${#positional[@]} -ge 1 ] && [ ${#positional[@]} -le 2 ] || { usage >&2; die "give CHECKPOINT and optionally DATA_BIN"; }
checkpoint="${positional[0]}" data="${positional[1]:-data-bin/wikitext-103}"
here="$(cd "$(dirname "$0")" && pwd)"
user_dir="${USER_DIR:-$(dirname "$(dirname "$here")")/fairseq_clusterformer}"
if [ "$small" = 1 ]; then d_tokens=1024 d_context=512 d_max_tokens=4096; else d_tokens=3072 d_context=2560 d_max_tokens=3072; fi
subset="${SUBSET:-test}"

[ -f "$checkpoint" ] || die "checkpoint $checkpoint not found"
[ -f "$data/dict.txt" ] || die "$data/dict.txt not found: run examples/wikitext103/prepare.sh first (or pass DATA_BIN)"
[ -f "$data/$subset.bin" ] || die "$data/$subset.bin not found: SUBSET=$subset is not a binarised split of $data"
command -v fairseq-eval-lm >/dev/null || die "fairseq-eval-lm not found on PATH: activate the environment with fairseq"

log="${LOG:-$(dirname "$checkpoint")/eval-$subset.log}"
# shellcheck disable=SC2206  # EXTRA_ARGS is meant to be word-split
extra=(${EXTRA_ARGS:-})
fairseq-eval-lm "$data" --user-dir "$user_dir" --path "$checkpoint" --gen-subset "$subset" \
  --tokens-per-sample "${TOKENS:-$d_tokens}" --context-window "${CONTEXT_WINDOW:-$d_context}" \
  --max-tokens "${MAX_TOKENS:-$d_max_tokens}" --softmax-batch "${SOFTMAX_BATCH:-1024}" --num-workers 0 \
  "${extra[@]}" > "$log" 2>&1 || { tail -n 20 "$log" >&2; die "fairseq-eval-lm failed (log: $log)"; }
result="$(grep -E "Loss \(base 2\): [0-9.]+, Perplexity: [0-9.]+" "$log" | tail -n 1)" \
  || die "no 'Perplexity' line in $log"
grep -E "Evaluated [0-9,]+ tokens" "$log" | sed -E 's/^.*(Evaluated)/\1/' || true
echo "perplexity: $(sed -E 's/^.*Perplexity: ([0-9.]+).*$/\1/' <<< "$result")"
