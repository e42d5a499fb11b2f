#!/usr/bin/env bash
# The source-code corpus of the long-range comparison, binarised for fairseq: Python files of installed packages
# (default: torch and fairseq, pinned by the project's set-up) or of any folder, as Python tokens with per-file
# placeholders for file-local names (examples/code/build_corpus.py says why). Python's standard library becomes a second
# test split (test1 in fairseq's naming: `--gen-subset test1`).
#
#   bash examples/code/prepare.sh [--data DIR] [--out DIR] [--packages "NAME ..."]
#   --data DIR:      every *.py file under DIR instead of the installed packages (no standard-library split then)
#   --out DIR:       where text/ and data-bin/ go (default: code-work): a new or empty folder, or one this script made
#                    before (it leaves .made-by-recipe there), whose text/ and data-bin/ it then makes again
#   --packages LIST: installed distributions to read (default: torch and fairseq-fixed, or fairseq on Python 3.10)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
out=code-work data="" packages=""
# shellcheck source=../recipe_args.sh
source "$repo/examples/recipe_args.sh"
recipe_flag --data data DIR
recipe_flag --out out DIR
recipe_flag --packages packages LIST
recipe_parse "$@"
((${#RECIPE_ARGS[@]} == 0)) || recipe_die "unexpected argument ${RECIPE_ARGS[0]} (see --help)"
[ -z "$data" ] || [ -z "$packages" ] || recipe_die "--data and --packages exclude each other"
recipe_own_dir --out "$out"
if [ -n "$data" ]; then
  source=(--data "$data")
else
  # shellcheck disable=SC2206  # a space-separated list of names
  source=(${packages:+--packages $packages} --stdlib)
fi
# build_corpus.py checks its sources before it writes anything: a refused source leaves no folder behind
python "$repo/examples/code/build_corpus.py" --out "$out/text" "${source[@]}"
recipe_claim_dir "$out"
tests="$out/text/test.txt"
[ ! -f "$out/text/stdlib.txt" ] || tests="$tests,$out/text/stdlib.txt"
rm -rf "$out/data-bin"
fairseq-preprocess --only-source --trainpref "$out/text/train.txt" --validpref "$out/text/valid.txt" \
  --testpref "$tests" --destdir "$out/data-bin" --workers 2
cp "$out/text/corpus.json" "$out/data-bin/"
echo "binarised: $out/data-bin (corpus.json records the sources and the splits' SHA-256)"
