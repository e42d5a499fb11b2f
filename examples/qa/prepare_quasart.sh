#!/usr/bin/env bash
# Quasar-T (https://github.com/bdhingra/quasar, data at http://curtis.ml.cmu.edu/datasets/quasar/).
#   bash examples/qa/prepare_quasart.sh [--contexts short|long] [--data DIR] [--out DIR] [--bpe-dir DIR]
#       [--spm-vocab N]
# --data DIR: DIR is the quasar-t folder (questions/{train,dev,test}_questions.json.gz and
#   contexts/{short,long}/{split}_contexts.json.gz) instead of downloading it.
# --contexts: the sentence-level (short, default) or document-level (long) retrieved contexts.
NAME=quasart CONTEXTS=short
source "$(dirname "$0")/prepare_common.sh"
recipe_flag --contexts CONTEXTS short\|long
parse_flags "$@"

SRC="${DATA:-$OUT/download/quasar-t}"
URL=http://curtis.ml.cmu.edu/datasets/quasar/quasar-t
for split in train dev test; do
    questions="$SRC/questions/${split}_questions.json.gz"
    contexts="$SRC/contexts/$CONTEXTS/${split}_contexts.json.gz"
    if [[ -z "$DATA" ]]; then
        fetch "$URL/questions/${split}_questions.json.gz" "$questions"
        fetch "$URL/contexts/$CONTEXTS/${split}_contexts.json.gz" "$contexts"
    fi
    convert quasart "$questions" "$OUT/jsonl/$split.jsonl" --contexts "$contexts"
done
binarize --train "$OUT/jsonl/train.jsonl" --valid "$OUT/jsonl/dev.jsonl" --test "$OUT/jsonl/test.jsonl"
