# What examples/{wikitext103,enwik8}/{train,eval}.sh have in common: sourced by them, never run. The caller sets
# recipe (wikitext103|enwik8), level (word|char, the preset's level), default_data, about (a line on what it trains
# or scores) and, for eval.sh, metric (perplexity|bpc), then calls train_main or eval_main with its arguments.
# The settings of every preset come from fairseq_clusterformer/scripts/lm/presets.py, the file that
# examples/compare.sh runs too: the recipes and the comparison cannot drift apart.

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
user_dir="${USER_DIR:-$repo/fairseq_clusterformer}"

die() { echo "$(basename "$0"): $*" >&2; exit 2; }
# shellcheck source=recipe_args.sh
source "$repo/examples/recipe_args.sh"

# --preset / --small / --dry-run / -h, the positional arguments into $positional, then the environment variables
# given (as names) that must be whole numbers
parse_recipe_args() {
  local ints=()
  while [ "$1" != -- ]; do ints+=("$1"); shift; done
  shift
  preset=paper dry=0
  recipe_flag --preset preset P
  recipe_flag --small preset =small
  recipe_flag --dry-run dry =1
  recipe_parse "$@"
  positional=(${RECIPE_ARGS[@]+"${RECIPE_ARGS[@]}"})
  recipe_env int "${ints[@]}"
  # tiny: smoke's old name, which presets.py still takes (saying so on stderr)
  case "$preset" in paper|small|smoke|tiny) ;; *) die "--preset must be paper, small or smoke, got '$preset'" ;; esac
  # preset_<setting>=<value> for every setting of the preset at this recipe's level, and preset_name
  local values
  values="$("${PYTHON:-python}" "$repo/fairseq_clusterformer/scripts/lm/presets.py" --preset "$preset" \
    --level "$level" --shell)" || die "could not read the $preset preset from presets.py (set PYTHON?)"
  eval "$values"
  preset="$preset_name"
}

options_help() {
  cat <<USAGE

  --preset P  paper (the default: the paper's section 4.2), small (CPU-sized) or smoke (seconds, for tests; its old
              name tiny still works); what each sets: docs/usage.md, "The LM presets"
  --small     the same as --preset small
  --dry-run   print the command and exit
  -h, --help  this text

The presets' values are those of examples/compare.sh (fairseq_clusterformer/scripts/lm/presets.py, read
with \$PYTHON, default python); --dry-run prints the command they make.

USAGE
}

# print a command as it can be pasted back into a shell
print_command() {
  local arg
  printf '%s' "$1"
  for arg in "${@:2}"; do
    case "$arg" in ""|*[!A-Za-z0-9_./,:=+@-]*) printf " '%s'" "${arg//\'/\'\\\'\'}" ;; *) printf ' %s' "$arg" ;; esac
  done
  printf '\n'
}

need_tool() {
  command -v "$1" >/dev/null || die "$1 not found on PATH: activate the environment with fairseq"
}

train_main() {
  usage() {
    cat <<USAGE
usage: examples/$recipe/train.sh [--preset paper|small|smoke | --small] [--dry-run] [DATA_BIN]

$about
USAGE
    options_help
    cat <<USAGE
Every setting is an environment variable (default: the preset's):
  LONG_RANGE=cluster (--long-range-layer)  CLUSTERS  CAUSALITY=strict|paper  ARCH  LAYERS  HEADS  EMBED_DIM  FFN_DIM
  LONG_RANGE_LAYERS  TOKENS  WINDOW  STRIDE  BATCH (segments per update, all GPUs and UPDATE_FREQ together)
  UPDATE_FREQ=1  GPUS (all visible)  OPTIMIZER  LR  CLIP  WARMUP  UPDATES  DROPOUT  CRITERION  MEMORY_SIZE
  CLUSTER_UPDATE_INTERVAL  KMEANS_ITERS  KMEANS_BACKEND=auto  SEED=1  NUM_WORKERS=2
  PRECISION=fp32|fp16|memory-efficient-fp16|amp (GPU half precision; FP16=1 is fp16; bf16: see below)
  LOG_INTERVAL  SAVE_DIR (checkpoints/$recipe-<long range>-<clusters>c-<causality>[-<preset>])
  EXTRA_ARGS (appended to the fairseq-train command, word-split)
USAGE
  }
  parse_recipe_args CLUSTERS LAYERS HEADS EMBED_DIM FFN_DIM TOKENS WINDOW STRIDE BATCH UPDATE_FREQ GPUS WARMUP UPDATES \
    MEMORY_SIZE CLUSTER_UPDATE_INTERVAL KMEANS_ITERS SEED NUM_WORKERS LOG_INTERVAL -- "$@"
  [ ${#positional[@]} -le 1 ] || die "one DATA_BIN only (got ${positional[*]})"
  local data="${positional[0]:-$default_data}"
  local long_range="${LONG_RANGE:-cluster}" causality="${CAUSALITY:-strict}" clusters="${CLUSTERS:-$preset_clusters}"
  case "$causality" in strict|paper) ;; *) die "CAUSALITY must be strict or paper, got '$causality'" ;; esac

  local gpus update_freq="${UPDATE_FREQ:-1}" batch="${BATCH:-$preset_batch}" ranks
  gpus="${GPUS:-$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)}"
  ranks=$(( gpus > 0 ? gpus : 1 ))
  (( batch % (ranks * update_freq) == 0 )) \
    || die "BATCH ($batch) must be divisible by GPUS x UPDATE_FREQ ($ranks x $update_freq)"

  local suffix="" optimizer="${OPTIMIZER:-$preset_optimizer}"
  [ "$preset" = paper ] || suffix="-$preset"
  local args=("$data" --user-dir "$user_dir" --task clusterformer_lm --arch "${ARCH:-$preset_arch}"
    --long-range-layers "${LONG_RANGE_LAYERS:-$preset_long_range_layers}" --long-range-layer "$long_range"
    --num-clusters "$clusters" --cluster-causality "$causality" --window-size "${WINDOW:-$preset_window}"
    --window-stride "${STRIDE:-$preset_stride}" --tokens-per-sample "${TOKENS:-$preset_tokens}"
    --sample-break-mode none --batch-size $(( batch / (ranks * update_freq) )) --update-freq "$update_freq"
    --max-update "${UPDATES:-$preset_updates}" --optimizer "$optimizer" --lr "${LR:-$preset_lr}"
    --clip-norm "${CLIP:-$preset_clip}" --lr-scheduler inverse_sqrt --warmup-updates "${WARMUP:-$preset_warmup}"
    --warmup-init-lr 1e-07 --dropout "${DROPOUT:-$preset_dropout}" --criterion "${CRITERION:-$preset_criterion}"
    --memory-size "${MEMORY_SIZE:-$preset_memory_size}"
    --cluster-update-interval "${CLUSTER_UPDATE_INTERVAL:-$preset_refresh_interval}"
    --kmeans-iters "${KMEANS_ITERS:-$preset_kmeans_iters}" --kmeans-backend "${KMEANS_BACKEND:-auto}"
    --save-dir "${SAVE_DIR:-checkpoints/$recipe-$long_range-${clusters}c-$causality$suffix}" --seed "${SEED:-1}"
    --log-format simple --log-interval "${LOG_INTERVAL:-$preset_log_interval}" --num-workers "${NUM_WORKERS:-2}")
  # the paper preset leaves the model's size to its named architecture; a variable set by the user always counts
  local layers="${LAYERS:-}" heads="${HEADS:-}" embed="${EMBED_DIM:-}" ffn="${FFN_DIM:-}"
  if [ "$preset_model_dims" = 1 ]; then
    layers="${layers:-$preset_layers}" heads="${heads:-$preset_heads}"
    embed="${embed:-$preset_embed_dim}" ffn="${ffn:-$preset_ffn_dim}"
    args+=(--decoder-normalize-before --share-decoder-input-output-embed)
  fi
  [ -z "$layers" ] || args+=(--decoder-layers "$layers")
  [ -z "$heads" ] || args+=(--decoder-attention-heads "$heads")
  [ -z "$embed" ] || args+=(--decoder-embed-dim "$embed")
  [ -z "$ffn" ] || args+=(--decoder-ffn-embed-dim "$ffn")
  [ "$optimizer" != adam ] || args+=(--adam-betas "(0.9, 0.98)")
  [ "$gpus" -le 1 ] || args+=(--distributed-world-size "$gpus")
  # fairseq 0.12's command line turns --bf16 into TPU mode (it then needs torch_xla, on GPUs too): refuse it here
  # rather than let fairseq-train fail with "'NoneType' object has no attribute 'xla_device'"
  [ "${BF16:-0}" = 0 ] || die "BF16=1: fairseq 0.12 ties --bf16 to TPUs (it needs torch_xla, also on GPUs); use PRECISION=fp16, memory-efficient-fp16 or amp (docs/training_at_scale.md)"
  local precision="${PRECISION:-fp32}"
  [ "${FP16:-0}" = 0 ] || precision=fp16
  case "$precision" in
    fp32) ;;
    fp16|memory-efficient-fp16|amp) args+=("--$precision") ;;
    *) die "PRECISION must be fp32, fp16, memory-efficient-fp16 or amp, got '$precision'" ;;
  esac
  # shellcheck disable=SC2206  # EXTRA_ARGS is meant to be word-split
  [ -z "${EXTRA_ARGS:-}" ] || args+=(${EXTRA_ARGS})

  print_command fairseq-train "${args[@]}"
  [ "$dry" = 0 ] || return 0
  [ -f "$data/dict.txt" ] || die "$data/dict.txt not found: run examples/$recipe/prepare.sh first (or pass DATA_BIN)"
  need_tool fairseq-train
  exec fairseq-train "${args[@]}"
}

eval_main() {
  usage() {
    cat <<USAGE
usage: examples/$recipe/eval.sh [--preset paper|small|smoke | --small] [--dry-run] CHECKPOINT [DATA_BIN]

$about
Runs fairseq-eval-lm on the test split of DATA_BIN (default $default_data) with CHECKPOINT (e.g.
checkpoints/$recipe-cluster-512c-strict/checkpoint_best.pt) and prints "$metric: <value>" as its last line.
Segments of TOKENS tokens, each scoring only the tokens after its first CONTEXT_WINDOW (fairseq's --context-window).
USAGE
    options_help
    cat <<USAGE
Environment (default: the preset's): TOKENS (must equal training's --tokens-per-sample), CONTEXT_WINDOW,
MAX_TOKENS (tokens per batch), SUBSET=test, SOFTMAX_BATCH=1024, LOG (default: eval-<subset>.log beside the
checkpoint), EXTRA_ARGS (appended to the fairseq-eval-lm command, word-split).
USAGE
  }
  parse_recipe_args TOKENS CONTEXT_WINDOW MAX_TOKENS SOFTMAX_BATCH -- "$@"
  [ ${#positional[@]} -ge 1 ] && [ ${#positional[@]} -le 2 ] || { usage >&2; die "give CHECKPOINT and optionally DATA_BIN"; }
  local checkpoint="${positional[0]}" data="${positional[1]:-$default_data}" subset="${SUBSET:-test}"
  local log="${LOG:-$(dirname "$checkpoint")/eval-$subset.log}"
  local args=("$data" --user-dir "$user_dir" --path "$checkpoint" --gen-subset "$subset"
    --tokens-per-sample "${TOKENS:-$preset_tokens}" --context-window "${CONTEXT_WINDOW:-$preset_context_window}"
    --max-tokens "${MAX_TOKENS:-$preset_eval_max_tokens}" --softmax-batch "${SOFTMAX_BATCH:-1024}" --num-workers 0)
  # shellcheck disable=SC2206  # EXTRA_ARGS is meant to be word-split
  [ -z "${EXTRA_ARGS:-}" ] || args+=(${EXTRA_ARGS})
  if [ "$dry" = 1 ]; then print_command fairseq-eval-lm "${args[@]}"; return 0; fi

  [ -f "$checkpoint" ] || die "checkpoint $checkpoint not found"
  [ -f "$data/dict.txt" ] || die "$data/dict.txt not found: run examples/$recipe/prepare.sh first (or pass DATA_BIN)"
  [ -f "$data/$subset.bin" ] || die "$data/$subset.bin not found: SUBSET=$subset is not a binarised split of $data"
  need_tool fairseq-eval-lm
  fairseq-eval-lm "${args[@]}" > "$log" 2>&1 || { tail -n 20 "$log" >&2; die "fairseq-eval-lm failed (log: $log)"; }
  local result
  result="$(grep -E "Loss \(base 2\): [0-9.]+, Perplexity: [0-9.]+" "$log" | tail -n 1)" \
    || die "no 'Loss (base 2): ..., Perplexity: ...' line in $log"
  grep -E "Evaluated [0-9,]+ tokens" "$log" | sed -E 's/^.*(Evaluated)/\1/' || true
  # one token is one byte at character level, so fairseq's loss in base 2 per token is the bits per character
  case "$metric" in
    perplexity) echo "perplexity: $(sed -E 's/^.*Perplexity: ([0-9.]+).*$/\1/' <<< "$result")" ;;
    bpc) echo "bpc: $(sed -E 's/^.*Loss \(base 2\): ([0-9.]+),.*$/\1/' <<< "$result")" ;;
  esac
}
