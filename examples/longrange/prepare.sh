#!/usr/bin/env bash
# Data of the long-range comparison, binarised for fairseq: the synthetic recall task (generated), WikiText-2 at word
# level and Tiny Shakespeare at character level (both committed in examples/data/).
#
#   bash examples/longrange/prepare.sh [--data DIR] [--out DIR]
#   --data DIR: a folder with wikitext-2/{valid,test}.txt and tinyshakespeare/input.txt (default: examples/data)
#   --out DIR:  where the binarised folders go (default: longrange-work/data-bin)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
data="$repo/examples/data" out=longrange-work/data-bin
# shellcheck source=../recipe_args.sh
source "$repo/examples/recipe_args.sh"
recipe_flag --data data DIR
recipe_flag --out out DIR
recipe_parse "$@"
[ ${#RECIPE_ARGS[@]} -eq 0 ] || recipe_die "unexpected argument ${RECIPE_ARGS[0]} (see --help)"
for f in wikitext-2/valid.txt wikitext-2/test.txt tinyshakespeare/input.txt; do
  [ -f "$data/$f" ] || { echo "prepare.sh: --data $data has no $f" >&2; exit 2; }
done
text="$out/../text"
mkdir -p "$out" "$text"

# the recall task: documents of 127 words (+ end of line = one 128-token sample), 6 facts recalled 40-100 words later
# (beyond the 28-token reach of train.sh's windows of 8), between fillers that repeat each document's own loop of 3-6
# of 256 words, so that in-context copying is learnt on every filler word
fairseq-clusterformer-recall-task --out "$text/recall" --seed 1 --length 127 --facts 6 --fillers 256 --filler loop \
  --loop-min 3 --loop-max 6 --min-distance 40 --max-distance 100 --train-docs 32000 --valid-docs 400 --test-docs 800

# WikiText-2 word level: the valid split trains, the test split's first 2,000 lines validate and the rest test
mkdir -p "$text/wikitext-2"
cp "$data/wikitext-2/valid.txt" "$text/wikitext-2/train.txt"
head -n 2000 "$data/wikitext-2/test.txt" > "$text/wikitext-2/valid.txt"
tail -n +2001 "$data/wikitext-2/test.txt" > "$text/wikitext-2/test.txt"

# Tiny Shakespeare as characters (spaces as "_"), split 90 / 5 / 5 % by lines
mkdir -p "$text/shakespeare"
python - "$data/tinyshakespeare/input.txt" "$text/shakespeare" <<'PY'
import sys
from pathlib import Path
lines = Path(sys.argv[1]).read_text(encoding="utf-8").splitlines()
chars = [" ".join(line.replace(" ", "_")) for line in lines if line]
cut1, cut2 = int(len(chars) * 0.9), int(len(chars) * 0.95)
for name, part in (("train", chars[:cut1]), ("valid", chars[cut1:cut2]), ("test", chars[cut2:])):
    (Path(sys.argv[2]) / f"{name}.txt").write_text("\n".join(part) + "\n", encoding="utf-8")
PY

for set in recall wikitext-2 shakespeare; do
  fairseq-preprocess --only-source --trainpref "$text/$set/train.txt" --validpref "$text/$set/valid.txt" \
    --testpref "$text/$set/test.txt" --destdir "$out/$set" --workers 2
done
echo "binarised: $out/{recall,wikitext-2,shakespeare}"
