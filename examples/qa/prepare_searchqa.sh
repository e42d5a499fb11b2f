#!/usr/bin/env bash
# SearchQA (https://github.com/nyu-dl/dl4ir-searchQA), the processed train/val/test.txt files.
#   bash examples/qa/prepare_searchqa.sh [--data DIR] [--out DIR] [--bpe-dir DIR] [--spm-vocab N]
# The files are on Google Drive (folder 0B51lBZ1gs1XTR3BIVTJQWkREQU0 in the data set's README): they are fetched
# with gdown (pip install gdown) when it is installed; otherwise download them by hand and give --data DIR.
# --data DIR: any folder holding train.txt, val.txt and test.txt (or the zip file that contains them).
NAME=searchqa
source "$(dirname "$0")/prepare_common.sh"
parse_flags "$@"

SRC="${DATA:-$OUT/download}"
if [[ -z "$DATA" ]]; then
    command -v gdown >/dev/null || { echo "$0: needs gdown to download from Google Drive, or --data DIR" >&2; exit 1; }
    gdown --folder "https://drive.google.com/drive/folders/0B51lBZ1gs1XTR3BIVTJQWkREQU0" -O "$SRC"
fi
find_split() {  # the split's text file anywhere under SRC, unzipping archives first when it is not there yet
    local file; file=$(find "$SRC" -name "$1.txt" | head -1)
    if [[ -z "$file" ]]; then
        find "$SRC" -name '*.zip' -exec unzip -n -q {} -d "$OUT/download/unzipped" \;
        file=$(find "$SRC" "$OUT/download/unzipped" -name "$1.txt" 2>/dev/null | head -1)
    fi
    [[ -n "$file" ]] || { echo "$0: no $1.txt under $SRC" >&2; exit 1; }
    echo "$file"
}
for split in train val test; do
    convert searchqa "$(find_split $split)" "$OUT/jsonl/$split.jsonl"
done
binarize --train "$OUT/jsonl/train.jsonl" --valid "$OUT/jsonl/val.jsonl" --test "$OUT/jsonl/test.jsonl"
