#!/usr/bin/env bash
# `make gpu-bundle`: every wheel the lent GPU machine lacks to run `make gpu-check`, in .gpu-bundle/ (git-ignored).
#
# That machine has Python 3.12 with torch 2.11 and numpy 2.x but no fairseq and no network
# (the development machines' device tool); `benchmarks/gpu_check/device_run.sh` installs this folder there. It holds:
#   fairseq-fixed 0.12.3.1     built here for cp312: only its Cython/C extensions are compiled (see TORCH_STUB)
#   hydra-core, omegaconf, antlr4-python3-runtime, bitarray
#                              what `import fairseq` needs that the machine's image lacks (cffi, sklearn, scipy,
#                              sacrebleu, regex, tqdm, yaml are there; fairseq imports no cffi)
#   fairseq_clusterformer      this project's wheel, for its console scripts (the tree's code still wins: device_run.sh
#                              puts the repository first on PYTHONPATH)
#   numpy1/numpy 1.26.4        in a folder of its own: fairseq calls np.compat.long, gone in numpy 2, so device_run.sh
#                              puts numpy 1.26 first when the machine's torch, scipy and sklearn import with it
#                              (WITH_NUMPY1=0 leaves it out: on the H100 of 2026-11-27 the image's SciPy refused it)
# faiss is not bundled (too large; the GPU's default K-Means backend is torch). The fairseq wheel is rebuilt without
# the data files under fairseq/examples/ (test arrays, images, notebooks: 10 of its 12 MB), which nothing imports;
# that folder's Python files stay (fairseq's speech tasks import some).
#
#   bash benchmarks/gpu_check/bundle.sh [DEST]     (benchmarks/qa_device/prepare.sh: WITH_NUMPY1=0)
# The interpreter: PY312=/path/to/python3.12, else python3.12 on PATH, else pyenv's newest 3.12. DEST must be a new or
# empty folder, or one this script made before (it leaves .made-by-recipe there): the wheels are built in a temporary
# folder and replace DEST's only once all of them are there, so a failing build leaves the earlier bundle as it was.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../../examples/recipe_args.sh
source "$REPO/examples/recipe_args.sh"
(($# <= 1)) || recipe_die "one argument at most, the bundle's folder (got $#)"
(($# == 0)) || [[ -n "$1" ]] || recipe_die "DEST: expected a folder, got an empty value"
DEST=$(realpath -m "${1:-$REPO/.gpu-bundle}")
recipe_own_dir DEST "$DEST"

python312() {  # the first Python 3.12 found: PY312, PATH, pyenv
    local candidate root
    if [[ -n "${PY312:-}" ]]; then echo "$PY312"; return; fi
    root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    for candidate in "$(command -v python3.12 || true)" $(ls -d "$root"/versions/3.12*/bin/python3.12 2>/dev/null |
        sort -rV); do
        [[ -n "$candidate" ]] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null &&
            { echo "$candidate"; return; }
    done
    recipe_die "found no Python 3.12 (on PATH or under $root/versions): name one with PY312=/path/to/python3.12"
}
PY312=$(python312) || exit 2
BUILD_VENV=${BUILD_VENV:-/tmp/py312-build}
FAIRSEQ=fairseq-fixed==0.12.3.1
# The Cython extensions are compiled against numpy 2 headers: such a module also loads under numpy 1.26 (numpy 2
# builds target the older C API by default), while one built against numpy 1 refuses to load under numpy 2. So the
# same wheel serves both numpy choices of device_run.sh.
BUILD_NUMPY=numpy==2.2.6
# Versions as in this project's own Python 3.11 environment (.venv), where the test suite passes.
PURE=(hydra-core==1.3.2 omegaconf==2.3.0)
BINARY=(bitarray==3.12.3)
NUMPY1=numpy==1.26.4
WITH_NUMPY1=${WITH_NUMPY1:-1}
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

"$PY312" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' ||
  recipe_die "PY312=$PY312 is not Python 3.12"
export MAX_JOBS=1 OMP_NUM_THREADS=1 PIP_DISABLE_PIP_VERSION_CHECK=1
test -x "$BUILD_VENV/bin/python" || "$PY312" -m venv "$BUILD_VENV"
PIP=("$BUILD_VENV/bin/python" -m pip)
"${PIP[@]}" install -q "$BUILD_NUMPY" cython setuptools wheel
if "$BUILD_VENV/bin/python" -c 'import torch' 2>/dev/null; then
  echo "bundle.sh: $BUILD_VENV has torch; use a venv without it (BUILD_VENV=...)" >&2
  exit 1
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FINAL=$DEST DEST=$WORK/bundle  # built here, moved into FINAL at the end
mkdir -p "$DEST"

# TORCH_STUB: fairseq-fixed's setup.py imports torch.utils.cpp_extension unconditionally, for three C++ extensions
# built against torch (libbase, libnat, alignment_train) that language modelling and QA never import. A stub torch
# lets setup.py run without a real one; its extensions are optional, so they fail to compile (no torch headers) and
# are left out, while libbleu and the two Cython modules are built as usual.
mkdir -p "$WORK/stub/torch/utils"
touch "$WORK/stub/torch/__init__.py" "$WORK/stub/torch/utils/__init__.py"
cat >"$WORK/stub/torch/utils/cpp_extension.py" <<'EOF'
from setuptools import Extension
from setuptools.command.build_ext import build_ext as BuildExtension


def CppExtension(name, sources, **kwargs):
    return Extension(name, sources, optional=True, **kwargs)
EOF
echo "== $FAIRSEQ (cp312, extensions compiled here)"
PYTHONPATH="$WORK/stub" "${PIP[@]}" wheel -q --no-deps --no-build-isolation --no-binary fairseq-fixed \
  -w "$DEST" "$FAIRSEQ" 2>&1 | grep -v -e "is ignored" -e "^\s*$" | tail -5 || true
ls "$DEST"/fairseq_fixed-*.whl >/dev/null
"$BUILD_VENV/bin/python" -m wheel unpack -d "$WORK/slim" "$DEST"/fairseq_fixed-*.whl >/dev/null
find "$WORK"/slim/fairseq_fixed-*/fairseq/examples -type f ! -name '*.py' -delete
rm "$DEST"/fairseq_fixed-*.whl
"$BUILD_VENV/bin/python" -m wheel pack -d "$DEST" "$WORK"/slim/fairseq_fixed-* >/dev/null

echo "== ${PURE[*]} ${BINARY[*]}"
"${PIP[@]}" download -q --no-deps "${PLATFORM[@]}" -d "$DEST" "${PURE[@]}" "${BINARY[@]}" 2>&1 | grep -v "is ignored" || true
if [ "$WITH_NUMPY1" = 1 ]; then
  echo "== $NUMPY1"
  mkdir -p "$DEST/numpy1"
  "${PIP[@]}" download -q --no-deps "${PLATFORM[@]}" -d "$DEST/numpy1" "$NUMPY1" 2>&1 | grep -v "is ignored" || true
fi
# antlr4 4.9.3 (what omegaconf 2.3 and hydra 1.3 pin) is published as an sdist only: a pure-Python wheel is built
echo "== antlr4-python3-runtime==4.9.3"
"${PIP[@]}" wheel -q --no-deps --no-build-isolation -w "$DEST" antlr4-python3-runtime==4.9.3 2>&1 | grep -v "is ignored" || true

# the project's wheel, built from a copy so that no build/ or *.egg-info lands in the shared tree
echo "== fairseq_clusterformer (this tree)"
mkdir -p "$WORK/project"
cp "$REPO/setup.py" "$REPO/pyproject.toml" "$REPO/README.md" "$REPO/LICENSE" "$WORK/project/"
cp -r "$REPO/fairseq_clusterformer" "$WORK/project/"
find "$WORK/project" -name __pycache__ -prune -exec rm -rf {} +
"${PIP[@]}" wheel -q --no-deps --no-build-isolation -w "$DEST" "$WORK/project" 2>&1 | grep -v "is ignored" || true

wanted=(fairseq_fixed hydra_core omegaconf antlr4_python3_runtime bitarray fairseq_clusterformer)
[ "$WITH_NUMPY1" = 1 ] && wanted+=(numpy1/numpy)
for name in "${wanted[@]}"; do
  ls "$DEST/$name"-*.whl >/dev/null 2>&1 || { echo "bundle.sh: no $name wheel in $DEST" >&2; exit 1; }
done
ls -lR "$DEST"
size=$(du -sm "$DEST" | cut -f1)
if [ "$size" -gt 45 ]; then
  echo "bundle.sh: ${size} MiB is over the 45 MiB the device call leaves for it; $FINAL is left as it was" >&2
  exit 1
fi
# the new wheels replace what this script put into FINAL before (its wheels and numpy1/), nothing else
recipe_claim_dir "$FINAL"
rm -rf "$FINAL"/*.whl "$FINAL/numpy1"
cp -r "$DEST"/. "$FINAL"/
echo "gpu-bundle: $(find "$FINAL" -name '*.whl' | wc -l) wheels, ${size} MiB in $FINAL"
