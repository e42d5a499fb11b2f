#!/usr/bin/env bash
# Download enwik8 and binarise it byte by byte: the standard split (first 90M bytes train, next 5M valid, last 5M
# test), one token per byte, as Transformer-XL's preparation does.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: examples/enwik8/prepare.sh [--data DIR] [--dest DIR] [--valid-bytes N] [--test-bytes N] [--workers N]

Without --data: downloads enwik8.zip (36 MB) from Matt Mahoney's site into $DOWNLOAD_DIR (default
data/enwik8-raw), splits it and binarises it. With --data DIR: uses DIR/enwik8 or DIR/enwik8.zip instead (any
file read as bytes works, e.g. a few hundred KB for a test, with the split scaled down by the two flags below).

  --data DIR        folder holding enwik8 or enwik8.zip (nothing is downloaded)
  --dest DIR        output folder for fairseq (default data-bin/enwik8)
  --valid-bytes N   bytes of the validation split, taken before the test bytes (default 5000000)
  --test-bytes N    bytes of the test split, taken from the end (default 5000000)
  --workers N       fairseq-preprocess workers (default 4)
  -h, --help        this text

Environment: ENWIK8_URL (default http://mattmahoney.net/dc/enwik8.zip), DOWNLOAD_DIR, PYTHON (default python).
USAGE
}

die() { echo "prepare.sh: $*" >&2; exit 2; }

data="" dest="data-bin/enwik8" workers=4 valid_bytes=5000000 test_bytes=5000000
# shellcheck source=../recipe_args.sh
source "$(dirname "$0")/../recipe_args.sh"
recipe_flag --data data DIR
recipe_flag --dest dest DIR
recipe_flag --valid-bytes valid_bytes int
recipe_flag --test-bytes test_bytes int
recipe_flag --workers workers int
recipe_parse "$@"
[ ${#RECIPE_ARGS[@]} -eq 0 ] || die "unexpected argument ${RECIPE_ARGS[0]} (see --help)"
python="${PYTHON:-python}"
command -v fairseq-preprocess >/dev/null || die "fairseq-preprocess not found on PATH: activate the environment with fairseq"

if [ -z "$data" ]; then
  data="${DOWNLOAD_DIR:-data/enwik8-raw}"
  mkdir -p "$data"
  if [ ! -s "$data/enwik8.zip" ]; then
    url="${ENWIK8_URL:-http://mattmahoney.net/dc/enwik8.zip}"
    echo "downloading $url"
    curl -fL --retry 3 -o "$data/enwik8.zip.part" "$url" || die "could not download $url; set ENWIK8_URL or pass --data DIR"
    mv "$data/enwik8.zip.part" "$data/enwik8.zip"
  fi
fi

[ -d "$data" ] || die "--data $data: no such folder"
if [ -f "$data/enwik8" ]; then source="$data/enwik8"
elif [ -f "$data/enwik8.zip" ]; then source="$data/enwik8.zip"
else die "--data $data: missing $data/enwik8 (or $data/enwik8.zip)"
fi

mkdir -p "$dest"
text="$dest/text"
"$python" -m fairseq_clusterformer.scripts.lm.prepare_enwik8 --input "$source" --out-dir "$text" \
  --valid-bytes "$valid_bytes" --test-bytes "$test_bytes" 2> >(grep -v "tensorboardX" >&2)
echo "binarising $text into $dest"
fairseq-preprocess --only-source --trainpref "$text/train.txt" --validpref "$text/valid.txt" \
  --testpref "$text/test.txt" --destdir "$dest" --workers "$workers" > "$dest/preprocess.log" 2>&1 \
  || { tail -n 20 "$dest/preprocess.log" >&2; die "fairseq-preprocess failed (log: $dest/preprocess.log)"; }
grep -E "\[None\] .* sents, " "$dest/preprocess.log" | sed -E 's/^.*\[None\] //' || true
echo "done: $dest ($(($(wc -l < "$dest/dict.txt"))) byte values in the dictionary)"
