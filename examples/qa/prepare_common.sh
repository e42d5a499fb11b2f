# Shared by the prepare_*.sh recipes (sourced, not run). Parses the common flags, fetches the GPT-2 BPE files and
# binarises QA JSONL records with the console scripts. Each recipe sets NAME and defines its own extra flags in
# EXTRA_FLAGS_HELP / handle_flag.
#   --data DIR        use the data set's files already in DIR instead of downloading them
#   --out DIR         where the JSONL records (DIR/jsonl) and binarised data (DIR/bin) go (default data-bin/qa/NAME)
#   --bpe-dir DIR     local GPT-2 encoder.json, vocab.bpe and dict.txt (default: fairseq's, downloaded into DIR/gpt2_bpe)
#   --spm-vocab N     tokenise with a sentencepiece model of N pieces trained on the training records instead
#   --hf-dir DIR      tokenise as the Hugging Face encoder imported into DIR (fairseq-clusterformer-import-hf) does
# Environment: MAX_CONTEXT_TOKENS (default 10000).
set -euo pipefail

DATA="" OUT="" BPE_DIR="" SPM_VOCAB="" HF_DIR=""
parse_flags() {
    while (($#)); do
        case "$1" in
            --data) DATA="$2"; shift 2 ;;
            --out) OUT="$2"; shift 2 ;;
            --bpe-dir) BPE_DIR="$2"; shift 2 ;;
            --spm-vocab) SPM_VOCAB="$2"; shift 2 ;;
            --hf-dir) HF_DIR="$2"; shift 2 ;;
            -h|--help) sed -n '2,/^[^#]/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
            *) if ! handle_flag "$@"; then echo "$0: unknown flag $1 (see --help)" >&2; exit 2; fi; shift 2 ;;
        esac
    done
    OUT="${OUT:-data-bin/qa/$NAME}"
    mkdir -p "$OUT/jsonl" "$OUT/download"
    if [[ -n "$DATA" && ! -d "$DATA" ]]; then echo "$0: --data $DATA is not a directory" >&2; exit 2; fi
    if [[ -n "$HF_DIR" && ! -f "$HF_DIR/tokenizer.json" ]]; then
        echo "$0: --hf-dir $HF_DIR holds no tokenizer.json (import the encoder with fairseq-clusterformer-import-hf)" >&2
        exit 2
    fi
}

fetch() {  # fetch URL FILE: download unless FILE is already there
    [[ -s "$2" ]] && return 0
    mkdir -p "$(dirname "$2")"
    echo "downloading $1" >&2
    curl -fL --retry 3 -o "$2.part" "$1" && mv "$2.part" "$2"
}

convert() {  # convert FORMAT INPUT OUTPUT.jsonl [flags...]
    fairseq-clusterformer-qa-convert --format "$@"
}

binarize() {  # binarize --train X.jsonl --valid Y.jsonl ... (the training split drops examples it cannot learn from)
    local tok=()
    if [[ -n "$HF_DIR" ]]; then
        tok=(--tokenizer hf --hf-dir "$HF_DIR")
    elif [[ -n "$SPM_VOCAB" ]]; then
        local train; train=$(printf '%s\n' "$@" | grep -A1 -x -- --train | tail -1)
        fairseq-clusterformer-train-spm --input "$train" --model-prefix "$OUT/spm/qa" --vocab-size "$SPM_VOCAB"
        tok=(--tokenizer sentencepiece --sentencepiece-model "$OUT/spm/qa.model")
    else
        if [[ -z "$BPE_DIR" ]]; then
            BPE_DIR="$OUT/gpt2_bpe"
            for f in encoder.json vocab.bpe dict.txt; do
                fetch "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/$f" "$BPE_DIR/$f"
            done
        fi
        tok=(--tokenizer gpt2 --encoder-json "$BPE_DIR/encoder.json" --vocab-bpe "$BPE_DIR/vocab.bpe"
             --dict "$BPE_DIR/dict.txt")
    fi
    # binarise the training split on its own so that --drop-unreachable applies to it alone
    local args=("$@") i
    for ((i = 0; i < ${#args[@]}; i += 2)); do
        local extra=()
        [[ "${args[i]}" == --train ]] && extra=(--drop-unreachable)
        fairseq-clusterformer-qa-binarize "${tok[@]}" "${args[i]}" "${args[i+1]}" --destdir "$OUT/bin" \
            --max-context-tokens "${MAX_CONTEXT_TOKENS:-10000}" "${extra[@]}"
    done
    echo "binarised data: $OUT/bin (counts of skipped examples per reason: $OUT/bin/qa_config.json)"
}
