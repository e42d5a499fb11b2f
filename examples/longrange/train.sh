#!/usr/bin/env bash
# Train one row of the long-range comparison: the same 4-layer, 128-dim pre-norm model with full attention
# (fairseq's own transformer_lm, the upper bound), sliding windows only (the lower bound), or sliding windows with
# long-range layers 2 and 4 (Cluster-Former in both causality modes, LSH, sparse).
#
#   bash examples/longrange/train.sh KIND SEED DATA_BIN SAVE_DIR [extra fairseq-train flags]
#   KIND: full | none | cluster-strict | cluster-paper | lsh | sparse
#
# Environment: UPDATES (3000), TOKENS (tokens per sample, 128), BATCH (samples per update, 2048 / TOKENS),
# WINDOW (8; reach = 4 x (WINDOW - 1) = 28), LAYERS (--long-range-layers, 2,4), SLIDING (--sliding-windows:
# overlap, the paper, or band), VALUES (--long-range-values: own, the paper, or next; next needs a strict kind),
# CLUSTERS (16), LR (0.002, constant after 200 warm-up updates), THREADS (OMP_NUM_THREADS, 1). The defaults are the
# recall task's (examples/longrange/README.md); examples/code/README.md sets them for source code.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
kind=$1 seed=$2 data=$3 save=$4
shift 4
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=../recipe_args.sh
source "$repo/examples/recipe_args.sh"
recipe_check int "SEED $seed" "$seed"
recipe_env int UPDATES TOKENS BATCH WINDOW CLUSTERS THREADS
window=${WINDOW:-8}
model=(--decoder-layers 4 --decoder-embed-dim 128 --decoder-ffn-embed-dim 512 --decoder-attention-heads 4
  --decoder-normalize-before --share-decoder-input-output-embed --dropout 0)
case "$kind" in
  full) arch=(--task language_modeling --arch transformer_lm) ;;
  none | cluster-strict | cluster-paper | lsh | sparse)
    layer=${kind%-*} causality=strict
    [ "$kind" != cluster-paper ] || causality=paper
    arch=(--user-dir "$repo/fairseq_clusterformer" --task clusterformer_lm --arch clusterformer_lm_tiny
      --window-size "$window" --window-stride $((window / 2)) --sliding-windows "${SLIDING:-overlap}"
      --long-range-layers "${LAYERS:-2,4}" --long-range-layer "$layer" --long-range-values "${VALUES:-own}"
      --num-clusters "${CLUSTERS:-16}" --cluster-causality "$causality"
      --memory-size 20000 --cluster-update-interval 250 --kmeans-iters 10) ;;
  *) echo "train.sh: KIND must be full, none, cluster-strict, cluster-paper, lsh or sparse, got '$kind'" >&2; exit 2 ;;
esac
export OMP_NUM_THREADS=${THREADS:-1}
tokens=${TOKENS:-128}
fairseq-train "$data" "${arch[@]}" "${model[@]}" \
  --tokens-per-sample "$tokens" --sample-break-mode none --batch-size "${BATCH:-$((2048 / tokens))}" \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr "${LR:-0.002}" --lr-scheduler fixed --warmup-updates 200 \
  --clip-norm 1.0 --max-update "${UPDATES:-3000}" --seed "$seed" --save-dir "$save" --no-epoch-checkpoints \
  --validate-interval-updates 500 --save-interval-updates 500 --keep-interval-updates 1 --log-interval 50 \
  --num-workers 0 "$@"
