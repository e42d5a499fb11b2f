#!/usr/bin/env bash
# Download WikiText-103 and binarise it with fairseq-preprocess (word level, the tokenised release).
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: examples/wikitext103/prepare.sh [--data DIR] [--dest DIR] [--workers N]

Without --data: downloads wikitext-103-v1.zip (the tokenised release, 181 MB) from its official location into
$DOWNLOAD_DIR (default data/wikitext-103-raw), unzips it and binarises wiki.{train,valid,test}.tokens.
With --data DIR: uses the local files in DIR instead, named wiki.{train,valid,test}.tokens or
{train,valid,test}.txt (nothing is downloaded).

  --data DIR     local text files to binarise instead of downloading
  --dest DIR     output folder for fairseq (default data-bin/wikitext-103)
  --workers N    fairseq-preprocess workers (default 4)
  -h, --help     this text

Environment: WIKITEXT103_URL (download address; default the official one, with the original S3 address as a
fallback), DOWNLOAD_DIR.
USAGE
}

die() { echo "prepare.sh: $*" >&2; exit 2; }

data="" dest="data-bin/wikitext-103" workers=4
# shellcheck source=../recipe_args.sh
source "$(dirname "$0")/../recipe_args.sh"
recipe_flag --data data DIR
recipe_flag --dest dest DIR
recipe_flag --workers workers int
recipe_parse "$@"
[ ${#RECIPE_ARGS[@]} -eq 0 ] || die "unexpected argument ${RECIPE_ARGS[0]} (see --help)"
command -v fairseq-preprocess >/dev/null || die "fairseq-preprocess not found on PATH: activate the environment with fairseq"

if [ -z "$data" ]; then
  download="${DOWNLOAD_DIR:-data/wikitext-103-raw}"
  mkdir -p "$download"
  zip="$download/wikitext-103-v1.zip"
  if [ ! -s "$zip" ]; then
    urls=("${WIKITEXT103_URL:-https://wikitext.smerity.com/wikitext-103-v1.zip}"
          "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip")
    for url in "${urls[@]}"; do
      echo "downloading $url"
      if curl -fL --retry 3 -o "$zip.part" "$url"; then mv "$zip.part" "$zip"; break; fi
    done
    [ -s "$zip" ] || die "could not download WikiText-103 from ${urls[*]}; set WIKITEXT103_URL or pass --data DIR"
  fi
  (cd "$download" && unzip -oq wikitext-103-v1.zip)
  data="$download/wikitext-103"
fi

[ -d "$data" ] || die "--data $data: no such folder"
prefs=()
for split in train valid test; do
  if [ -f "$data/wiki.$split.tokens" ]; then file="$data/wiki.$split.tokens"
  elif [ -f "$data/$split.txt" ]; then file="$data/$split.txt"
  else die "--data $data: missing $data/wiki.$split.tokens (or $data/$split.txt)"
  fi
  prefs+=("--${split}pref" "$file")
done

mkdir -p "$dest"
echo "binarising $data into $dest"
fairseq-preprocess --only-source "${prefs[@]}" --destdir "$dest" --workers "$workers" > "$dest/preprocess.log" 2>&1 \
  || { tail -n 20 "$dest/preprocess.log" >&2; die "fairseq-preprocess failed (log: $dest/preprocess.log)"; }
grep -E "\[None\] .* sents, " "$dest/preprocess.log" | sed -E 's/^.*\[None\] //' || true
echo "done: $dest (dictionary of $(wc -l < "$dest/dict.txt") words)"
