#!/usr/bin/env bash
# The one command for the lent GPU machine (lent through the development machines' device tool): `make gpu-check` within its budget.
#
#   device tool: run(command="bash benchmarks/gpu_check/device_run.sh", carry=[".gpu-bundle"], timeout_s=600)
#
# All six parts do not fit one call's budget: a lent session runs one of these two (GPU_CHECK_ARGS before the command),
# the check's validation and its speed figures; a plain call runs the parts in order and skips the rest.
#   GPU_CHECK_ARGS="--parts tests,train,kmeans,generation" bash benchmarks/gpu_check/device_run.sh
#   GPU_CHECK_ARGS="--parts layers,model" bash benchmarks/gpu_check/device_run.sh
#
# First `make gpu-bundle` here (the wheels that machine lacks). There it installs the bundle into /tmp/site, prints
# nvidia-smi, runs the driver with --budget-minutes (parts that no longer fit are recorded as skipped), and packs
# every result and log into $OUT/gpu-check.tgz, with $OUT/summary.md beside it (files back: at most 8). A failing
# step is reported and the next one still runs; the archive is made whatever happened.
#
# Overrides: PYTHON (default python3: the machine's torch), BUNDLE (default .gpu-bundle), SKIP_INSTALL=1 (a local dry
# run with an environment that has fairseq already), GPU_BUDGET_MINUTES (default 8), GPU_CHECK_ARGS (more driver
# options, e.g. "--device cpu --size tiny"), OUT (default /tmp/gpu-check-device-out where the tool sets none).
# It is the GPU's check: on a machine whose torch sees no GPU, or with GPU_BUDGET_MINUTES=0 (every part skipped), it
# refuses (exit 2) before anything is written, unless GPU_CHECK_ARGS holds --device cpu (the CPU dry run of the tests,
# which then adds nothing of benchmarks/results/gpu/ to its results).
cd "$(dirname "$0")/../.." || exit 1
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
BUNDLE=${BUNDLE:-$REPO/.gpu-bundle}
BUDGET=${GPU_BUDGET_MINUTES:-8}
OUT=${OUT:-/tmp/gpu-check-device-out}
SITE=${SITE:-/tmp/site}
refuse() { echo "device_run.sh: $*" >&2; exit 2; }
CPU_DRY_RUN=0
[[ " ${GPU_CHECK_ARGS:-} " =~ \ --device[\ =]cpu\  ]] && CPU_DRY_RUN=1
[[ "$BUDGET" =~ ^[0-9]*[.]?[0-9]+$ ]] || refuse "GPU_BUDGET_MINUTES=$BUDGET: expected a number of minutes"
if ((!CPU_DRY_RUN)); then
  awk -v m="$BUDGET" 'BEGIN { exit !(m > 0) }' ||
    refuse "GPU_BUDGET_MINUTES=$BUDGET: every part would be skipped; give the minutes the call may use (default 8)," \
      "or GPU_CHECK_ARGS=\"--device cpu\" for a CPU dry run"
  # the machine's own torch (the bundle brings none)
  "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    refuse "$PYTHON's torch sees no GPU here: this is the GPU's check, and a CPU's results would be packed as" \
      "the GPU's; GPU_CHECK_ARGS=\"--device cpu\" runs it on the CPU as a dry run"
fi
RUN=$(mktemp -d /tmp/gpu-check-run.XXXX)
mkdir -p "$OUT" "$RUN/results" "$RUN/work"
LOG=$RUN/device_run.log
exec > >(tee "$LOG") 2>&1
step() { echo "== $(date -u +%H:%M:%S) $*"; }

step "install the bundle ($BUNDLE) into $SITE"
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
if [ "${SKIP_INSTALL:-0}" = 1 ]; then
  echo "SKIP_INSTALL=1: using $PYTHON's own packages"
else
  pip_in() { "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }
  pip_in "$SITE" "$BUNDLE"/*.whl || echo "install FAILED (exit $?)"
  pip_in "$SITE-numpy1" "$BUNDLE"/numpy1/*.whl || echo "numpy 1.26 install FAILED (exit $?)"
  export PATH=$SITE/bin:$PATH
  # fairseq calls np.compat.long (gone in numpy 2): numpy 1.26 goes first when the machine's torch, scipy and
  # sklearn (which `import fairseq` loads) work with it; else the machine's numpy 2 (fairseq's extensions in the
  # bundle load under both), and only the np.compat paths (--sample-break-mode eos) would fail
  PROBE='import numpy, torch, scipy.stats, sklearn.metrics, fairseq, fairseq_clusterformer, hydra, bitarray
print("numpy", numpy.__version__, "torch", torch.__version__, "fairseq", fairseq.__version__, "from", fairseq.__file__)'
  if PYTHONPATH=$REPO:$SITE-numpy1:$SITE "$PYTHON" -c "$PROBE"; then
    export PYTHONPATH=$REPO:$SITE-numpy1:$SITE
  else
    echo "numpy 1.26 does not work with this image (above): the image's numpy is kept"
    export PYTHONPATH=$REPO:$SITE
    "$PYTHON" -c "$PROBE" || echo "import check FAILED: the parts that need fairseq will fail"
  fi
fi
echo "PYTHONPATH=$PYTHONPATH"
echo "fairseq-train: $(command -v fairseq-train || echo "not on PATH (the driver also looks beside $PYTHON)")"

# a call with --parts (in GPU_CHECK_ARGS) adds its parts to those committed in benchmarks/results/gpu/ by earlier calls
COMMITTED=$REPO/benchmarks/results/gpu
# (not into a CPU dry run's)
case " ${GPU_CHECK_ARGS:-} " in
  *" --parts"*) if ((!CPU_DRY_RUN)) && [ -f "$COMMITTED/summary.json" ]; then cp -r "$COMMITTED/." "$RUN/results/"; fi ;;
esac

step "nvidia-smi"
nvidia-smi 2>&1 | tee "$RUN/nvidia-smi.txt" || echo "nvidia-smi FAILED"

step "gpu-check --budget-minutes $BUDGET"
# stopped a minute past its budget at the latest, so that the packing below still runs inside the device call
limit=$(awk -v m="$BUDGET" 'BEGIN { printf "%d", m * 60 + 60 }')
# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of options
PYTHONUNBUFFERED=1 timeout -k 10 "$limit" "$PYTHON" -m benchmarks.gpu_check --out "$RUN/results" \
  --work-dir "$RUN/work" --budget-minutes "$BUDGET" ${GPU_CHECK_ARGS:-}
code=$?
step "gpu-check exit $code"

step "pack into $OUT"
# results, logs and small records; not the checkpoints and binarised data of the work dir
(cd "$RUN/work" && find . -type f \( -name '*.log' -o -name '*.xml' -o -name '*.jsonl' \) -size -4M) >"$RUN/list"
tar czf "$OUT/gpu-check.tgz" -C "$RUN" results nvidia-smi.txt device_run.log \
  $(sed 's|^\./|work/|' "$RUN/list") 2>&1 || echo "tar exit $? (a log still being written is reported as changed)"
if [ -f "$RUN/results/summary.md" ]; then
  cp "$RUN/results/summary.md" "$OUT/summary.md"
else
  printf '# gpu-check summary\n\nNo summary: gpu-check exited %s. See device_run.log in gpu-check.tgz.\n' "$code" \
    >"$OUT/summary.md"
fi
printf '\ngpu-check exit code: %s; budget %s min; archive gpu-check.tgz (results/, work/ logs, device_run.log).\n' \
  "$code" "$BUDGET" >>"$OUT/summary.md"
ls -l "$OUT"
exit "$code"
