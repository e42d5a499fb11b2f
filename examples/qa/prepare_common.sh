# Shared by the prepare_*.sh recipes (sourced, not run). Parses the common flags, fetches the GPT-2 BPE files and
# binarises QA JSONL records with the console scripts. Each recipe sets NAME and its defaults, sources this file,
# declares its own extra flags with recipe_flag (examples/recipe_args.sh) and calls parse_flags "$@".
#   --data DIR        use the data set's files already in DIR instead of downloading them
#   --out DIR         where the JSONL records (DIR/jsonl) and binarised data (DIR/bin) go (default data-bin/qa/NAME)
#   --bpe-dir DIR     local GPT-2 encoder.json, vocab.bpe and dict.txt (default: fairseq's, downloaded into DIR/gpt2_bpe)
#   --spm-vocab N     tokenise with a sentencepiece model of N pieces trained on the training records instead
#   --hf-dir DIR      tokenise as the Hugging Face encoder imported into DIR (fairseq-clusterformer-import-hf) does
# Environment: MAX_CONTEXT_TOKENS (default 10000).
set -euo pipefail

DATA="" OUT="" BPE_DIR="" SPM_VOCAB="" HF_DIR=""
# shellcheck source=../recipe_args.sh
source "$(dirname "${BASH_SOURCE[0]}")/../recipe_args.sh"
recipe_flag --data DATA DIR
recipe_flag --out OUT DIR
recipe_flag --bpe-dir BPE_DIR DIR
recipe_flag --spm-vocab SPM_VOCAB int
recipe_flag --hf-dir HF_DIR DIR
parse_flags() {  # every check before the first folder is made
    recipe_parse "$@"
    ((${#RECIPE_ARGS[@]} == 0)) || recipe_die "unexpected argument ${RECIPE_ARGS[0]} (see --help)"
    recipe_env int MAX_CONTEXT_TOKENS
    OUT="${OUT:-data-bin/qa/$NAME}"
    if [[ -n "$DATA" && ! -d "$DATA" ]]; then echo "$0: --data $DATA is not a directory" >&2; exit 2; fi
    if [[ -n "$HF_DIR" && ! -f "$HF_DIR/tokenizer.json" ]]; then
        echo "$0: --hf-dir $HF_DIR holds no tokenizer.json (import the encoder with fairseq-clusterformer-import-hf)" >&2
        exit 2
    fi
    mkdir -p "$OUT/jsonl" "$OUT/download"
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
