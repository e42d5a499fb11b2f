#!/usr/bin/env bash
# The one command for the lent GPU machine: table b of examples/qa/README.md (whole-article QA from all-MiniLM-L6-v2,
# seeds 1, 2). The first call ran none / cluster / lsh / sparse and table a's paragraph re-run; this one runs the
# driver's default variants (hybrid cluster / lsh / sparse at 5, 6; one Cluster-Former layer, 6), reusing the
# committed rows of the same settings (none among them) and measuring qa-reach on the Cluster-Former runs.
#
#   device tool: run(command="bash benchmarks/qa_device/device_run.sh", carry=[".qa-device"], timeout_s=570)
#
# First, here: `bash benchmarks/qa_device/prepare.sh` (.qa-device/: the bundle, the cut float16 encoder, the data).
# There it installs the bundle into /tmp/site (the repository first on PYTHONPATH, so the tree's code runs), prints
# nvidia-smi and runs `python -m benchmarks.qa_device` (the runs side by side on the GPU; README.md beside this file)
# until QA_DEVICE_MINUTES after its own start, less PACK_S for packing: it stops every run then, and a run that did
# not finish leaves no result. It packs RESULTS into $OUT/results.tgz (device/: one folder per scored run, runs.json,
# report.md / .json, calls/<UTC time>/ with this log, the schedule and the GPU's load), with report.md, report.json
# and device_run.log beside it: 4 files back. Commit them: `tar xzf results.tgz -C benchmarks/results/qa_pretrained`.
# The same command in a later call resumes: a run whose summary.json is in RESULTS with the same settings is skipped.
#
# Overrides: QA_DEVICE_MINUTES (8.5), QA_DEVICE_ARGS (more driver flags: --seeds 2, --no-table-a, --parallel 4),
# PYTHON (python3: the machine's torch), PAYLOAD (.qa-device), RESULTS (benchmarks/results/qa_pretrained/device), OUT
# (/tmp/qa-device-out where the tool sets none), PACK_S (30), SKIP_INSTALL=1 (an environment with fairseq already),
# QA_DEVICE_TINY=1 (the CPU dry run's sizes; tests/test_qa_device_table.py).
START=$(date +%s)
cd "$(dirname "$0")/../.." || exit 1
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
PAYLOAD=$(realpath -m "${PAYLOAD:-$REPO/.qa-device}")
RESULTS=$(realpath -m "${RESULTS:-$REPO/benchmarks/results/qa_pretrained/device}")
OUT=${OUT:-/tmp/qa-device-out}
SITE=${SITE:-/tmp/site}
MINUTES=${QA_DEVICE_MINUTES:-8.5}
PACK_S=${PACK_S:-30}
# refused (exit 2) before anything is written: a missing payload, and a machine whose torch sees no GPU (these are
# the GPU's runs) unless QA_DEVICE_TINY=1
refuse() { echo "device_run.sh: $*" >&2; exit 2; }
[[ -f "$PAYLOAD/SHA256SUMS" ]] ||
  refuse "PAYLOAD=$PAYLOAD holds no payload (no SHA256SUMS): make it first with bash benchmarks/qa_device/prepare.sh"
if [ "${QA_DEVICE_TINY:-0}" != 1 ]; then
  "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    refuse "$PYTHON's torch sees no GPU here: the QA device runs need one (bf16 autocast, their sizes);" \
      "QA_DEVICE_TINY=1 is the CPU dry run at tiny sizes"
fi
RUN=$(mktemp -d /tmp/qa-device-run.XXXX)
mkdir -p "$OUT" "$RESULTS"
exec > >(tee "$RUN/device_run.log") 2>&1
stamp() { echo "== $(date -u +%H:%M:%S) (+$(($(date +%s) - START)) s) $*"; }
STOP_AT=$(awk -v s="$START" -v m="$MINUTES" -v p="$PACK_S" 'BEGIN { printf "%d", s + m * 60 - p }')

export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  stamp "install $PAYLOAD/bundle into $SITE"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$PAYLOAD"/bundle/*.whl || echo "install FAILED (exit $?)"
  export PATH=$SITE/bin:$PATH PYTHONPATH=$REPO:$SITE
fi
# train.sh and fairseq's scripts call `python`; the image may name its interpreter python3 only
if ! command -v python >/dev/null; then
  mkdir -p "$RUN/bin" && ln -s "$(command -v "$PYTHON")" "$RUN/bin/python" && export PATH=$RUN/bin:$PATH
fi
"$PYTHON" -c 'import numpy, torch, fairseq, fairseq_clusterformer
print("numpy", numpy.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available(), "fairseq",
      fairseq.__version__, "from", fairseq.__file__)' || echo "import check FAILED"
stamp "nvidia-smi"
nvidia-smi 2>&1 || echo "no nvidia-smi"

TINY=()
[ "${QA_DEVICE_TINY:-0}" = 1 ] && TINY=(--tiny --threads 1)
stamp "runs until +$((STOP_AT - START)) s"
# the driver stops its runs at STOP_AT; killed 20 s later at the latest, so that the packing below still runs
# shellcheck disable=SC2086  # QA_DEVICE_ARGS is a list of flags
left=$((STOP_AT - $(date +%s)))
((left > 0)) || left=0
PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 5 $((left + 20)) \
  "$PYTHON" -m benchmarks.qa_device --payload "$PAYLOAD" --work "$RUN/work" --results "$RESULTS" --stop-at "$STOP_AT" \
  "${TINY[@]}" ${QA_DEVICE_ARGS:-}
code=$?
stamp "driver exit $code"

stamp "pack into $OUT"
call=$(ls -d "$RESULTS"/calls/*/ 2>/dev/null | tail -1)
[ -n "$call" ] && cp "$RUN/device_run.log" "$call"
tar czf "$OUT/results.tgz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")" || echo "tar exit $?"
for f in report.md report.json; do [ -f "$RESULTS/$f" ] && cp "$RESULTS/$f" "$OUT/$f"; done
cp "$RUN/device_run.log" "$OUT/device_run.log"
ls -l "$OUT"
rm -rf "$RUN/work"  # checkpoints and unpacked data: what mattered is in $RESULTS and $OUT now
exit "$code"
