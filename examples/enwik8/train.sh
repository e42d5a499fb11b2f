#!/usr/bin/env bash
# Train the paper's enwik8 character-level model (Cluster-Former, paper section 4.2) with fairseq-train.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: examples/enwik8/train.sh [--small] [--dry-run] [DATA_BIN]

Trains clusterformer_lm_enwik8 on DATA_BIN (default data-bin/enwik8, made by prepare.sh) with the paper's
settings: 16 layers, 8 heads, long-range layers 11 and 15, 3,072-token segments, window 256, stride 128, SGD,
lr 0.1, clip 0.1, warm-up 16,000, 286,000 updates, dropout 0.3, 16 segments per update.

  --small     a CPU-sized run: 6 layers of 128 dims, long-range layers 4 and 6, 2,048-byte segments, window 128,
              stride 64, 64 clusters, Adam, 300 updates, 2 segments per update
  --dry-run   print the fairseq-train command and exit
  -h, --help  this text

Every setting is an environment variable (defaults: paper / --small):
  LONG_RANGE=cluster|lsh|sparse|none  CLUSTERS=512/64  CAUSALITY=strict|paper  LONG_RANGE_LAYERS=11,15/4,6
  LAYERS=16/6  HEADS=8/4  EMBED_DIM=512/128  FFN_DIM=2048/256  TOKENS=3072/2048  WINDOW=256/128
  STRIDE=128/64  BATCH=16/2 (segments per update, all GPUs and UPDATE_FREQ together)  UPDATE_FREQ=1  GPUS (all
  visible)  OPTIMIZER=sgd/adam  LR=0.1/0.002  CLIP=0.1/0.5  WARMUP=16000/100  UPDATES=286000/300  DROPOUT=0.3/0.1
  MEMORY_SIZE=100000/20000  CLUSTER_UPDATE_INTERVAL=2000/100  KMEANS_ITERS=20/10  KMEANS_BACKEND=auto
  FP16=0|1  BF16=0|1  SEED=1  SAVE_DIR (checkpoints/enwik8-<long-range>...)  LOG_INTERVAL=100/50
  EXTRA_ARGS (appended to the fairseq-train command, word-split)
USAGE
}

die() { echo "train.sh: $*" >&2; exit 2; }

small=0 dry=0 data=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --small) small=1; shift ;;
    --dry-run) dry=1; shift ;;
    -*) usage >&2; die "unknown option: $1" ;;
    *) [ -z "$data" ] || die "one DATA_BIN only (got $data and $1)"; data="$1"; shift ;;
  esac
done
data="${data:-data-bin/enwik8}"
here="$(cd "$(dirname "$0")" && pwd)"
user_dir="${USER_DIR:-$(dirname "$(dirname "$here")")/fairseq_clusterformer}"

# paper defaults, or the CPU-sized ones with --small; every one can be overridden from the environment
if [ "$small" = 1 ]; then
  d_arch=clusterformer_lm d_layers=6 d_heads=4 d_embed=128 d_ffn=256 d_lrl=4,6 d_tokens=2048 d_window=128 d_stride=64
  d_clusters=64 d_batch=2 d_opt=adam d_lr=0.002 d_clip=0.5 d_warmup=100 d_updates=300 d_dropout=0.1
  d_memory=20000 d_interval=100 d_iters=10 d_log=50 d_criterion=cross_entropy
else
  d_arch=clusterformer_lm_enwik8 d_layers=16 d_heads=8 d_embed=512 d_ffn=2048 d_lrl=11,15 d_tokens=3072 d_window=256
  d_stride=128 d_clusters=512 d_batch=16 d_opt=sgd d_lr=0.1 d_clip=0.1 d_warmup=16000 d_updates=286000
  d_dropout=0.3 d_memory=100000 d_interval=2000 d_iters=20 d_log=100 d_criterion=cross_entropy
fi
# the environment overrides and the command itself are shared with the other LM recipe
recipe=enwik8
# shellcheck source=../lm_train_common.sh
source "$here/../lm_train_common.sh"
