#!/usr/bin/env bash
# A QA model that learns something on a 2-core CPU in under 2 hours, from committed files only: pretrain a small
# RoBERTa with fairseq's own masked_lm task on local text, fine-tune clusterformer_qa from it on paragraph-level SQuAD,
# and score it beside a from-scratch control and two trivial baselines on held-out articles.
#   bash examples/qa/cpu_recipe.sh [--data DIR] [--out DIR] [--bpe-dir DIR] [--dry-run]
# --data DIR: holds dev-v1.1.json (default examples/data/squad, the committed official SQuAD v1.1 dev set); its
#   articles 0-39 are the training split, 40-47 are held out (prepare_squad.sh --split-dev 40 --contexts paragraph).
# --out DIR: everything it writes (default data-bin/qa/cpu): squad/ (records and binarised data), mlm/ (pretraining
#   text), roberta/ (the pretrained model.pt + dict.txt), qa_*/ (fine-tuned checkpoints, predictions),
#   summary.json (EM / F1 of every model and baseline).
# --bpe-dir DIR: GPT-2 encoder.json, vocab.bpe, dict.txt (default examples/data/gpt2_bpe).
# --roberta DIR: skip pretraining and fine-tune from DIR/model.pt + dict.txt (e.g. an earlier run's OUT/roberta; its
#   shape must be the one LAYERS / DIM / HEADS give).
# --dry-run: print the commands instead of running them.
# Pretraining text: the paragraphs of the training articles (never the held-out ones) and MLM_TEXT (default the
#   committed WikiText-2 valid and test files). Stages run two at a time, one thread each: masked-LM pretraining beside
#   the from-scratch QA control, then one fine-tuning per seed in SEEDS beside each other. Validation is off during
#   training; the last checkpoints are scored once, with the baselines, on every held-out question.
# Environment: MLM_UPDATES (600), MLM_LR (1e-3), QA_UPDATES (500), QA_LR (5e-4), SEEDS ("1 2"), LAYERS (4), DIM (128),
#   HEADS (4), LONG_RANGE (cluster), MAX_HOURS (per stage, a safety stop: 0.75), MLM_TEXT.
# Time on 2 CPU cores shared with other jobs: 43 minutes measured (examples/qa/README.md); MAX_HOURS caps each
#   training stage (fairseq's --stop-time-hours), for a machine that is slower or busier.
set -euo pipefail

DATA=examples/data/squad OUT=data-bin/qa/cpu BPE_DIR=examples/data/gpt2_bpe DRY=0 ROBERTA_DIR=""
# shellcheck source=../recipe_args.sh
source "$(dirname "$0")/../recipe_args.sh"
recipe_flag --data DATA DIR
recipe_flag --out OUT DIR
recipe_flag --bpe-dir BPE_DIR DIR
recipe_flag --roberta ROBERTA_DIR DIR
recipe_flag --dry-run DRY =1
recipe_parse "$@"
((${#RECIPE_ARGS[@]} == 0)) || recipe_die "unexpected argument ${RECIPE_ARGS[0]} (every setting is a flag; see --help)"
recipe_env int MLM_UPDATES QA_UPDATES LAYERS DIM HEADS
recipe_env number MAX_HOURS
for seed in ${SEEDS:-}; do recipe_check int "SEEDS=$SEEDS" "$seed"; done
[[ -f "$DATA/dev-v1.1.json" ]] || { echo "$0: --data $DATA holds no dev-v1.1.json" >&2; exit 2; }
if [[ -n "$ROBERTA_DIR" && ! -f "$ROBERTA_DIR/model.pt" ]]; then
    echo "$0: --roberta $ROBERTA_DIR holds no model.pt" >&2; exit 2
fi
for f in encoder.json vocab.bpe dict.txt; do
    [[ -f "$BPE_DIR/$f" ]] || { echo "$0: --bpe-dir $BPE_DIR holds no $f" >&2; exit 2; }
done
MLM_UPDATES="${MLM_UPDATES:-600}" MLM_LR="${MLM_LR:-1e-3}" QA_UPDATES="${QA_UPDATES:-500}" QA_LR="${QA_LR:-5e-4}"
SEEDS="${SEEDS:-1 2}" LAYERS="${LAYERS:-4}" DIM="${DIM:-128}" HEADS="${HEADS:-4}" LONG_RANGE="${LONG_RANGE:-cluster}"
MAX_HOURS="${MAX_HOURS:-0.75}" MLM_TEXT="${MLM_TEXT:-examples/data/wikitext-2/valid.txt examples/data/wikitext-2/test.txt}"
here="$(cd "$(dirname "$0")" && pwd)"
# the span baselines are scored by benchmarks/qa_report/baselines.py, found through PYTHONPATH from any directory
benchmarks_path="$(cd "$here/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"

run() { if ((DRY)); then printf '%q ' "$@"; echo; else "$@"; fi; }
# the encoder shape shared by pretraining and fine-tuning (the QA model refuses a checkpoint of another shape);
# 256 positions hold a QA window: <s> + 32 question tokens + </s></s> + 128 context tokens
SHAPE=(--encoder-layers "$LAYERS" --encoder-embed-dim "$DIM" --encoder-ffn-embed-dim $((4 * DIM))
       --encoder-attention-heads "$HEADS" --max-positions 256)

# 1. paragraph-level SQuAD: articles 0-39 train, 40-47 held out ("valid")
run bash "$here/prepare_squad.sh" --data "$DATA" --split-dev 40 --contexts paragraph --bpe-dir "$BPE_DIR" \
    --out "$OUT/squad"
# 2. masked-LM text: the training articles' paragraphs and MLM_TEXT, GPT-2 BPE, binarised with the same dict
#    (none with --roberta)
if [[ -z "$ROBERTA_DIR" ]]; then
    texts=()
    for t in $MLM_TEXT; do texts+=(--text "$t"); done
    run python "$here/mlm_text.py" --squad "$DATA/dev-v1.1.json" --articles 0:40 \
        "${texts[@]}" --encoder-json "$BPE_DIR/encoder.json" --vocab-bpe "$BPE_DIR/vocab.bpe" --output "$OUT/mlm/train.bpe"
    run fairseq-preprocess --only-source --srcdict "$BPE_DIR/dict.txt" --trainpref "$OUT/mlm/train.bpe" \
        --destdir "$OUT/mlm/bin" --workers 2
fi

pretrain() {
    run fairseq-train "$OUT/mlm/bin" --task masked_lm --criterion masked_lm --arch roberta_base "${SHAPE[@]}" \
        --tokens-per-sample 256 --sample-break-mode none --batch-size 8 --optimizer adam --adam-betas '(0.9,0.98)' \
        --adam-eps 1e-6 --weight-decay 0.01 --clip-norm 1.0 --lr "$MLM_LR" --lr-scheduler polynomial_decay \
        --warmup-updates $((MLM_UPDATES / 10)) --total-num-update "$MLM_UPDATES" --max-update "$MLM_UPDATES" \
        --stop-time-hours "$MAX_HOURS" --disable-validation --no-epoch-checkpoints --save-dir "$OUT/mlm/checkpoints" \
        --cpu --num-workers 0 --seed 1 --log-format simple --log-interval 20
}
finetune() {  # finetune NAME SEED [ROBERTA_DIR]: QA_UPDATES updates of 16 questions, the last checkpoint kept
    run env OMP_NUM_THREADS=1 ARCH=clusterformer_qa_tiny ROBERTA="${3:-}" LONG_RANGE="$LONG_RANGE" WINDOW=128 \
        STRIDE=96 MAX_QUESTION=32 BATCH=16 MAX_SENTENCES=16 LR="$QA_LR" WARMUP=50 UPDATES="$QA_UPDATES" \
        MAX_CONTEXT_TRAIN=1024 MAX_CONTEXT_EVAL=1024 KMEANS_INTERVAL=100 SEED="$2" SAVE_DIR="$OUT/$1" \
        bash "$here/train.sh" "$OUT/squad/bin" --small "${SHAPE[@]}" --disable-validation \
        --stop-time-hours "$MAX_HOURS" --log-interval 20
}
log() { if ((DRY)); then cat; else tee "$1"; fi; }
((DRY)) || mkdir -p "$OUT"
export OMP_NUM_THREADS=1
# 3. pretraining beside the from-scratch control (same fine-tuning, no pretrained encoder); with --roberta the
#    control runs beside the fine-tunings of stage 4 instead
start=$SECONDS
if [[ -z "$ROBERTA_DIR" ]]; then
    pretrain > >(log "$OUT/mlm.log") 2>&1 &
    finetune qa_scratch_seed1 1 > >(log "$OUT/qa_scratch_seed1.log") 2>&1
    wait
    echo "| stage 3 (pretraining || from-scratch QA): $((SECONDS - start)) s"
    ROBERTA_DIR="$OUT/roberta"
    ((DRY)) || { mkdir -p "$ROBERTA_DIR"; cp "$OUT/mlm/checkpoints/checkpoint_last.pt" "$ROBERTA_DIR/model.pt"
                 cp "$BPE_DIR/dict.txt" "$ROBERTA_DIR/dict.txt"; }
else
    finetune qa_scratch_seed1 1 > >(log "$OUT/qa_scratch_seed1.log") 2>&1 &
fi
# 4. fine-tuning from the pretrained encoder, one run per seed, side by side
for seed in $SEEDS; do
    finetune "qa_mlm_seed$seed" "$seed" "$ROBERTA_DIR" > >(log "$OUT/qa_mlm_seed$seed.log") 2>&1 &
done
wait
echo "| stage 4 (QA from the pretrained encoder, seeds $SEEDS): $((SECONDS - start)) s"
# 5. every held-out question: the models' last checkpoints, then the baselines
export OMP_NUM_THREADS=2
runs=(qa_scratch_seed1)
for seed in $SEEDS; do runs+=("qa_mlm_seed$seed"); done
for name in "${runs[@]}"; do
    run python -m fairseq_clusterformer.qa.scripts.predict "$OUT/squad/bin" --path "$OUT/$name/checkpoint_last.pt" \
        --split valid --output "$OUT/$name/valid.pred.json" --batch-size 32 --cpu | log "$OUT/$name.eval.log"
done
# the same official EM / F1 for every row, over every held-out question (one a model could not take scores 0); first
# spans of 6 and 12 words match the length of the models' answers, which token F1 rewards
preds=()
for name in "${runs[@]}"; do preds+=(--predictions "$name=$OUT/$name/valid.pred.json"); done
run env PYTHONPATH="$benchmarks_path" python -m benchmarks.qa_report.baselines --train "$OUT/squad/jsonl/train.jsonl" \
    --eval "$OUT/squad/jsonl/valid.jsonl" --seed 1 "${preds[@]}" \
    --first-words 6 --first-words 12 --json "$OUT/summary.json" | log "$OUT/summary.log"
