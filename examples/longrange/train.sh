#!/usr/bin/env bash
# Train one row of the long-range comparison: the same 4-layer, 128-dim pre-norm model with full attention
# (fairseq's own transformer_lm, the upper bound), sliding windows only (the lower bound), or sliding windows with
# long-range layers 2 and 4 (Cluster-Former in both causality modes, LSH, sparse).
#
#   bash examples/longrange/train.sh KIND SEED DATA_BIN SAVE_DIR [extra fairseq-train flags]
#   KIND: full | none | cluster-strict | cluster-paper | lsh | sparse
#
# Environment: UPDATES (3000), TOKENS (tokens per sample, 512), WINDOW (32; reach = 4 x (WINDOW - 1) = 124),
# CLUSTERS (64), LR (0.001), THREADS (OMP_NUM_THREADS, 1).
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
kind=$1 seed=$2 data=$3 save=$4
shift 4
repo="$(cd "$(dirname "$0")/../.." && pwd)"
window=${WINDOW:-32}
model=(--decoder-layers 4 --decoder-embed-dim 128 --decoder-ffn-embed-dim 512 --decoder-attention-heads 4
  --decoder-normalize-before --share-decoder-input-output-embed --dropout 0)
case "$kind" in
  full) arch=(--task language_modeling --arch transformer_lm) ;;
  none | cluster-strict | cluster-paper | lsh | sparse)
    layer=${kind%-*} causality=strict
    [ "$kind" != cluster-paper ] || causality=paper
    arch=(--user-dir "$repo/fairseq_clusterformer" --task clusterformer_lm --arch clusterformer_lm_tiny
      --window-size "$window" --window-stride $((window / 2)) --long-range-layers 2,4 --long-range-layer "$layer"
      --num-clusters "${CLUSTERS:-64}" --cluster-causality "$causality"
      --memory-size 20000 --cluster-update-interval 250 --kmeans-iters 10) ;;
  *) echo "train.sh: KIND must be full, none, cluster-strict, cluster-paper, lsh or sparse, got '$kind'" >&2; exit 2 ;;
esac
export OMP_NUM_THREADS=${THREADS:-1}
fairseq-train "$data" "${arch[@]}" "${model[@]}" \
  --tokens-per-sample "${TOKENS:-512}" --sample-break-mode none --batch-size 4 \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr "${LR:-0.001}" --lr-scheduler inverse_sqrt --warmup-updates 200 \
  --clip-norm 1.0 --max-update "${UPDATES:-3000}" --seed "$seed" --save-dir "$save" --no-epoch-checkpoints \
  --validate-interval-updates 500 --save-interval-updates 500 --keep-interval-updates 1 --log-interval 50 \
  --num-workers 0 "$@"
