#!/usr/bin/env bash
# Train the Cluster-Former QA model on a binarised QA data set (from prepare_{squad,quasart,searchqa,nq}.sh).
#   bash examples/qa/train.sh DATA_BIN [--small] [more fairseq-train flags...]
# Defaults are the paper's (section 4.2): RoBERTa-large with Cluster-Former layers 15 and 20 (clusterformer_qa_large),
# windows of 256 context tokens with stride 224, Adam, lr 5e-5, 2,220 warm-up updates of 22,200 (linear decay),
# 160 questions per update, dropout 0.1, contexts up to 5,000 tokens in training and 10,000 in validation.
# A longer context is truncated, never dropped (CONTEXT_OVERFLOW=truncate): a training context keeps whole
#   paragraphs, those holding a gold answer first; a validation context keeps its first tokens. The log says per
#   split how many examples were kept, truncated and skipped, and how many gold answers the cuts lost.
# --small: a CPU-sized run from scratch (clusterformer_qa_tiny, 4 layers of 64 dims, windows 64 / stride 48,
#   lr 1e-3, 8 questions per update, 2,000 updates, training contexts truncated to 2,048 tokens); override
#   as below.
# Environment overrides: ARCH, ROBERTA (directory with model.pt + dict.txt of a fairseq RoBERTa, or empty to train
#   from scratch), LR, WARMUP, UPDATES, BATCH (questions per update), MAX_SENTENCES (questions per forward pass and
#   device), DROPOUT, ATTENTION_DROPOUT (DROPOUT), LONG_RANGE (a --long-range-layer value: fairseq-train's help
#   lists them), CLUSTERS, WINDOW, STRIDE, MAX_CONTEXT_TRAIN, MAX_CONTEXT_EVAL, MAX_QUESTION, CONTEXT_OVERFLOW
#   (truncate|skip), MEMORY, KMEANS_INTERVAL, KMEANS_BACKEND, SAVE_DIR, SEED. Extra arguments go to fairseq-train as they are.
# A checkpoint_last.pt already in SAVE_DIR is resumed only if it was trained with this call's settings (the
#   RUN_SETTINGS below, less any flag the extra arguments give again): another run's is refused, naming each setting
#   that differs. --progress: that check, then the checkpoint's updates and training hours printed ("0 0" where there
#   is none) instead of training (the recipes that resume runs ask it how far a run got).
set -euo pipefail

if (($# < 1)) || [[ "$1" == -h || "$1" == --help ]]; then
    sed -n '2,/^[^#]/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
    exit $(($# < 1 ? 2 : 0))
fi
DATA="$1"; shift
SMALL=0 PROGRESS=0
EXTRA=()
for arg in "$@"; do
    case "$arg" in
        --small) SMALL=1 ;;
        --progress) PROGRESS=1 ;;
        *) EXTRA+=("$arg") ;;
    esac
done
# how far a run got is asked before its data is prepared too (a recipe's dry run)
((PROGRESS)) || [[ -f "$DATA/dict.txt" && -f "$DATA/qa_config.json" ]] ||
    { echo "$0: $DATA is not a binarised QA directory" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$(dirname "$here")")"
# shellcheck source=../recipe_args.sh
source "$repo/examples/recipe_args.sh"
recipe_env int WARMUP UPDATES BATCH MAX_SENTENCES CLUSTERS WINDOW STRIDE MAX_CONTEXT_TRAIN MAX_CONTEXT_EVAL \
    MAX_QUESTION MEMORY KMEANS_INTERVAL SEED

if ((SMALL)); then
    # a window is <s> question </s></s> + 64 context tokens, within the tiny model's 128 positions: 61-token questions
    ARCH="${ARCH:-clusterformer_qa_tiny}" LR="${LR:-1e-3}" WARMUP="${WARMUP:-200}" UPDATES="${UPDATES:-2000}"
    BATCH="${BATCH:-8}" MAX_SENTENCES="${MAX_SENTENCES:-8}" WINDOW="${WINDOW:-64}" STRIDE="${STRIDE:-48}"
    CLUSTERS="${CLUSTERS:-16}" MAX_CONTEXT_TRAIN="${MAX_CONTEXT_TRAIN:-2048}" MEMORY="${MEMORY:-20000}"
    KMEANS_INTERVAL="${KMEANS_INTERVAL:-200}" MAX_QUESTION="${MAX_QUESTION:-61}" ROBERTA="${ROBERTA:-}"
    DEVICE=(--cpu)
else
    ARCH="${ARCH:-clusterformer_qa_large}" LR="${LR:-5e-5}" WARMUP="${WARMUP:-2220}" UPDATES="${UPDATES:-22200}"
    BATCH="${BATCH:-160}" MAX_SENTENCES="${MAX_SENTENCES:-1}" WINDOW="${WINDOW:-256}" STRIDE="${STRIDE:-224}"
    CLUSTERS="${CLUSTERS:-512}" MAX_CONTEXT_TRAIN="${MAX_CONTEXT_TRAIN:-5000}" MEMORY="${MEMORY:-100000}"
    KMEANS_INTERVAL="${KMEANS_INTERVAL:-0}" MAX_QUESTION="${MAX_QUESTION:-64}"
    ROBERTA="${ROBERTA-data-bin/roberta.large}"
    DEVICE=()
fi
DROPOUT="${DROPOUT:-0.1}" ATTENTION_DROPOUT="${ATTENTION_DROPOUT:-${DROPOUT:-0.1}}" LONG_RANGE="${LONG_RANGE:-cluster}" MAX_CONTEXT_EVAL="${MAX_CONTEXT_EVAL:-10000}"
CONTEXT_OVERFLOW="${CONTEXT_OVERFLOW:-truncate}" KMEANS_BACKEND="${KMEANS_BACKEND:-auto}" SEED="${SEED:-1}"
SAVE_DIR="${SAVE_DIR:-checkpoints/qa_${ARCH}_${LONG_RANGE}}"

# 160 questions per update: as many forward passes per device as it takes (fairseq's --update-freq)
DEVICES=1
((SMALL)) || DEVICES=$(python -c "import torch; print(max(1, torch.cuda.device_count()))")
UPDATE_FREQ=$(((BATCH + MAX_SENTENCES * DEVICES - 1) / (MAX_SENTENCES * DEVICES)))

PRETRAINED=()
if [[ -n "$ROBERTA" ]]; then
    ((PROGRESS)) || [[ -f "$ROBERTA/model.pt" ]] ||
        { echo "$0: no RoBERTa checkpoint at $ROBERTA/model.pt (set ROBERTA= to train from scratch)" >&2; exit 2; }
    PRETRAINED=(--roberta-path "$ROBERTA")
fi

# the settings that make the run what it is: fairseq-train gets them, and a checkpoint already in SAVE_DIR must have
# been trained with them, else resuming it would go on under other settings, or score another run as this one
RUN_SETTINGS=(--arch "$ARCH" --long-range-layer "$LONG_RANGE" --num-clusters "$CLUSTERS" --window-size "$WINDOW"
    --window-stride "$STRIDE" --max-question-tokens "$MAX_QUESTION" --max-context-train "$MAX_CONTEXT_TRAIN"
    --max-context-eval "$MAX_CONTEXT_EVAL" --context-overflow "$CONTEXT_OVERFLOW" --adam-betas '(0.9, 0.98)'
    --adam-eps 1e-6 --weight-decay 0.01 --clip-norm 1.0 --lr "$LR" --warmup-updates "$WARMUP"
    --total-num-update "$UPDATES" --max-update "$UPDATES" --batch-size "$MAX_SENTENCES" --update-freq "$UPDATE_FREQ"
    --dropout "$DROPOUT" --attention-dropout "$ATTENTION_DROPOUT" --memory-size "$MEMORY"
    --cluster-update-interval "$KMEANS_INTERVAL" --kmeans-backend "$KMEANS_BACKEND" --optimizer adam
    --lr-scheduler polynomial_decay --seed "$SEED")
EXPECT=()
for ((i = 0; i < ${#RUN_SETTINGS[@]}; i += 2)); do
    flag="${RUN_SETTINGS[i]}" name="${RUN_SETTINGS[i]#--}"
    # a flag the extra arguments give again is theirs (fairseq-train takes the last value): not this list's to check
    [[ " ${EXTRA[*]-} " == *" $flag "* || " ${EXTRA[*]-} " == *" $flag="* ]] && continue
    EXPECT+=(--expect "${name//-/_}=${RUN_SETTINGS[i + 1]}")
done
progress=$(python "$repo/examples/checkpoint_progress.py" "$SAVE_DIR/checkpoint_last.pt" "${EXPECT[@]}") || exit 2
if ((PROGRESS)); then
    echo "$progress"
    exit 0
fi

set -x
fairseq-train "$DATA" --user-dir "$repo/fairseq_clusterformer" \
    --task clusterformer_qa --criterion clusterformer_qa "${PRETRAINED[@]}" "${RUN_SETTINGS[@]}" \
    --best-checkpoint-metric f1 --maximize-best-checkpoint-metric --no-epoch-checkpoints \
    --save-dir "$SAVE_DIR" --log-format simple --log-interval 50 --num-workers 0 \
    "${DEVICE[@]}" "${EXTRA[@]}"
