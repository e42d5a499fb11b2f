# The part of examples/{wikitext103,enwik8}/train.sh that does not depend on the data set: sourced by both after
# they set their defaults. Expects: recipe (wikitext103|enwik8), small, dry, data, user_dir, die, and the d_* defaults.
# Builds the fairseq-train command from the defaults and the environment overrides, prints it, and runs it.

long_range="${LONG_RANGE:-cluster}" causality="${CAUSALITY:-strict}" clusters="${CLUSTERS:-$d_clusters}"
case "$long_range" in cluster|lsh|sparse|none) ;; *) die "LONG_RANGE must be cluster, lsh, sparse or none, got '$long_range'" ;; esac
case "$causality" in strict|paper) ;; *) die "CAUSALITY must be strict or paper, got '$causality'" ;; esac

gpus="${GPUS:-$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)}"
update_freq="${UPDATE_FREQ:-1}" batch="${BATCH:-$d_batch}"
ranks=$(( gpus > 0 ? gpus : 1 ))
(( batch % (ranks * update_freq) == 0 )) \
  || die "BATCH ($batch) must be divisible by GPUS x UPDATE_FREQ ($ranks x $update_freq)"
per_rank=$(( batch / (ranks * update_freq) ))

suffix=""
[ "$small" = 0 ] || suffix="-small"
save_dir="${SAVE_DIR:-checkpoints/$recipe-$long_range-${clusters}c-$causality$suffix}"
args=("$data" --user-dir "$user_dir" --task clusterformer_lm --arch "${ARCH:-$d_arch}"
  --decoder-layers "${LAYERS:-$d_layers}" --decoder-attention-heads "${HEADS:-$d_heads}"
  --long-range-layers "${LONG_RANGE_LAYERS:-$d_lrl}" --long-range-layer "$long_range" --num-clusters "$clusters"
  --cluster-causality "$causality" --window-size "${WINDOW:-$d_window}" --window-stride "${STRIDE:-$d_stride}"
  --tokens-per-sample "${TOKENS:-$d_tokens}" --sample-break-mode none
  --batch-size "$per_rank" --update-freq "$update_freq" --max-update "${UPDATES:-$d_updates}"
  --optimizer "${OPTIMIZER:-$d_opt}" --lr "${LR:-$d_lr}" --clip-norm "${CLIP:-$d_clip}"
  --lr-scheduler inverse_sqrt --warmup-updates "${WARMUP:-$d_warmup}" --warmup-init-lr 1e-07
  --dropout "${DROPOUT:-$d_dropout}" --criterion "${CRITERION:-$d_criterion}"
  --memory-size "${MEMORY_SIZE:-$d_memory}" --cluster-update-interval "${CLUSTER_UPDATE_INTERVAL:-$d_interval}"
  --kmeans-iters "${KMEANS_ITERS:-$d_iters}" --kmeans-backend "${KMEANS_BACKEND:-auto}"
  --save-dir "$save_dir" --seed "${SEED:-1}" --log-format simple --log-interval "${LOG_INTERVAL:-$d_log}"
  --num-workers "${NUM_WORKERS:-2}")
embed="${EMBED_DIM:-$d_embed}" ffn="${FFN_DIM:-$d_ffn}"
[ -z "$embed" ] || args+=(--decoder-embed-dim "$embed")
[ -z "$ffn" ] || args+=(--decoder-ffn-embed-dim "$ffn")
[ "$small" = 0 ] || args+=(--decoder-normalize-before --share-decoder-input-output-embed)
[ "${OPTIMIZER:-$d_opt}" != adam ] || args+=(--adam-betas "(0.9, 0.98)")
[ "$gpus" -le 1 ] || args+=(--distributed-world-size "$gpus")
[ "${FP16:-0}" = 0 ] || args+=(--fp16)
[ "${BF16:-0}" = 0 ] || args+=(--bf16)
# shellcheck disable=SC2206  # EXTRA_ARGS is meant to be word-split
[ -z "${EXTRA_ARGS:-}" ] || args+=(${EXTRA_ARGS})

# print the command as it can be pasted back into a shell
quote() { case "$1" in ""|*[!A-Za-z0-9_./,:=+@-]*) printf " '%s'" "${1//\'/\'\\\'\'}" ;; *) printf ' %s' "$1" ;; esac; }
printf 'fairseq-train'; for arg in "${args[@]}"; do quote "$arg"; done; printf '\n'
[ "$dry" = 0 ] || exit 0
[ -f "$data/dict.txt" ] || die "$data/dict.txt not found: run examples/$recipe/prepare.sh first (or pass DATA_BIN)"
command -v fairseq-train >/dev/null || die "fairseq-train not found on PATH: activate the environment with fairseq"
exec fairseq-train "${args[@]}"
