#!/usr/bin/env bash
# Re-run the paper's Table 3 (language modelling) at a chosen scale: every row through the real fairseq-train and
# fairseq-eval-lm, into one markdown table. A thin wrapper of benchmarks.lm_compare.compare.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: examples/compare.sh [--preset smoke|small|paper] [--work DIR] [--levels word,char] [--rows all|KEY,...]
                           [--threads N] [--updates N] [--word-train FILE] [--word-eval FILE] [--char-text FILE]
                           [--word-data-bin DIR] [--char-data-bin DIR] [--list-rows]

Trains and evaluates the sliding window, sparse attention, LSH (64 buckets) and Cluster-Former with 64 / 256 / 512
clusters, every long-range row in strict and paper causality, with the same model, data and updates per level, and
writes DIR/results.md (metric, wall time and parameter count per row, and the exact commands). Rows already done are
skipped, so an interrupted run is resumed by running the same command again.

Defaults: --preset small, --work compare-work/<preset>, --threads 2 (OMP_NUM_THREADS of every fairseq process);
word level trains on examples/data/wikitext-2/valid.txt and evaluates on examples/data/wikitext-2/test.txt (cut
between articles into valid and test halves); character level reads examples/data/tinyshakespeare/input.txt as
bytes, split 90 % / 5 % / 5 % as enwik8 is. For the paper preset pass --word-data-bin / --char-data-bin made by
examples/wikitext103/prepare.sh and examples/enwik8/prepare.sh. What each preset sets: docs/usage.md, "The LM
presets" (examples/{wikitext103,enwik8}/train.sh --preset run the same; --preset tiny is smoke's old name).

Environment: PYTHON (default: the repository's .venv/bin/python if present, else python).
USAGE
}

for arg in "$@"; do
  case "$arg" in -h|--help) usage; exit 0 ;; esac
done
repo="$(cd "$(dirname "$0")/.." && pwd)"
default_python=python
[ ! -x "$repo/.venv/bin/python" ] || default_python="$repo/.venv/bin/python"
python="${PYTHON:-$default_python}"
command -v "$python" >/dev/null || { echo "compare.sh: $python not found: set PYTHON" >&2; exit 2; }

# the driver's own parser reads and checks every flag; this only picks the default --work of the preset, read as that
# parser reads it (also --preset=X, and an abbreviation such as --pre X). The default goes first, so that any --work
# the user gives, in any of its forms, comes later and wins.
preset=small
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --p | --pr | --pre | --pres | --prese | --preset) preset="${args[i + 1]:-}" ;;
    --p=* | --pr=* | --pre=* | --pres=* | --prese=* | --preset=*) preset="${args[i]#*=}" ;;
  esac
done
# python -m finds benchmarks/ in the repository, from whatever directory this runs
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m benchmarks.lm_compare.compare --work "compare-work/$preset" "$@"
