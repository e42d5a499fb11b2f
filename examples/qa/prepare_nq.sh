#!/usr/bin/env bash
# Natural Questions (https://ai.google.com/research/NaturalQuestions): simplified train set and the original-format
# dev set (5-way annotated; the converter simplifies it the way Google's simplify_nq_example does).
#   bash examples/qa/prepare_nq.sh [--data DIR] [--out DIR] [--bpe-dir DIR] [--spm-vocab N]
# Downloads about 5 GB (simplified train 4.4 GB, dev 1 GB). --data DIR: use
#   DIR/v1.0-simplified/simplified-nq-train.jsonl.gz and DIR/v1.0/dev/nq-dev-*.jsonl.gz instead.
NAME=nq
source "$(dirname "$0")/prepare_common.sh"
parse_flags "$@"

SRC="${DATA:-$OUT/download}"
URL=https://storage.googleapis.com/natural_questions
TRAIN=v1.0-simplified/simplified-nq-train.jsonl.gz
if [[ -z "$DATA" ]]; then
    fetch "$URL/$TRAIN" "$SRC/$TRAIN"
    for i in 00 01 02 03 04; do fetch "$URL/v1.0/dev/nq-dev-$i.jsonl.gz" "$SRC/v1.0/dev/nq-dev-$i.jsonl.gz"; done
fi
convert nq "$SRC/$TRAIN" "$OUT/jsonl/train.jsonl"
rm -f "$OUT/jsonl/dev.jsonl.part"
for shard in "$SRC"/v1.0/dev/nq-dev-*.jsonl.gz; do
    convert nq "$shard" "$OUT/jsonl/dev-shard.jsonl"
    cat "$OUT/jsonl/dev-shard.jsonl" >> "$OUT/jsonl/dev.jsonl.part"
done
mv "$OUT/jsonl/dev.jsonl.part" "$OUT/jsonl/dev.jsonl" && rm -f "$OUT/jsonl/dev-shard.jsonl"
binarize --train "$OUT/jsonl/train.jsonl" --valid "$OUT/jsonl/dev.jsonl"
