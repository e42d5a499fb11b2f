#!/usr/bin/env bash
# SQuAD (https://rajpurkar.github.io/SQuAD-explorer/) as long-context QA: each article is one context.
#   bash examples/qa/prepare_squad.sh [--version 1.1|2.0] [--contexts article|paragraph] [--data DIR] [--split-dev N]
#       [--out DIR] [--bpe-dir DIR] [--spm-vocab N] [--hf-dir DIR]
# --contexts paragraph: each question's context is its own paragraph (SQuAD's usual setting) instead of its article.
# --data DIR: use DIR/train-vV.json and DIR/dev-vV.json instead of downloading them.
# --split-dev N: no training file; the first N articles of dev-vV.json are the train split, the rest valid
#   (e.g. --data examples/data/squad --split-dev 40 --bpe-dir examples/data/gpt2_bpe for the committed
#   48-article v1.1 dev set and GPT-2 BPE).
# --hf-dir DIR: tokenise as the Hugging Face encoder imported into DIR does (fairseq-clusterformer-import-hf).
NAME=squad VERSION=1.1 SPLIT_DEV="" CONTEXTS=article
source "$(dirname "$0")/prepare_common.sh"
recipe_flag --version VERSION 1.1\|2.0
recipe_flag --split-dev SPLIT_DEV int
recipe_flag --contexts CONTEXTS article\|paragraph
parse_flags "$@"

SRC="${DATA:-$OUT/download}"
if [[ -z "$DATA" ]]; then
    for split in train dev; do
        [[ -n "$SPLIT_DEV" && $split == train ]] && continue
        fetch "https://rajpurkar.github.io/SQuAD-explorer/dataset/$split-v$VERSION.json" "$SRC/$split-v$VERSION.json"
    done
fi
DEV="$SRC/dev-v$VERSION.json"
if [[ -n "$SPLIT_DEV" ]]; then
    convert squad "$DEV" "$OUT/jsonl/train.jsonl" --articles "0:$SPLIT_DEV" --context-unit "$CONTEXTS"
    convert squad "$DEV" "$OUT/jsonl/valid.jsonl" --articles "$SPLIT_DEV:" --context-unit "$CONTEXTS"
else
    convert squad "$SRC/train-v$VERSION.json" "$OUT/jsonl/train.jsonl" --context-unit "$CONTEXTS"
    convert squad "$DEV" "$OUT/jsonl/valid.jsonl" --context-unit "$CONTEXTS"
fi
binarize --train "$OUT/jsonl/train.jsonl" --valid "$OUT/jsonl/valid.jsonl"
