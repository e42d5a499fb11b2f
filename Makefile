# Developer tasks. `make help` lists them. Every target builds the virtual environment it needs when it is missing;
# a stamp file inside the environment (redone when setup.py or this file changes) keeps a second run from reinstalling.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
PYTEST_ARGS ?=
# pytest-xdist workers: one per core, at most 4 (each end-to-end test starts fairseq processes of about 1 GB);
# tests/conftest.py gives each worker its share of the cores as torch / OpenMP threads. TEST_WORKERS=0 runs in one
# process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS))

VENV := .venv
TORCH := 2.13.0
# Keep in step with setup.py's fairseq requirement for Python >= 3.11.
FAIRSEQ := fairseq-fixed==0.12.3.1

VENV_0122 := .venv-fairseq-0.12.2
# torch 2.0.1: the lowest release that setup.py accepts, so that this environment also checks that floor (2.3 GB to
# download with its CUDA 11.7 libraries). torchaudio is pinned with it: fairseq asks for any torchaudio, and pip
# would otherwise take the newest, built for another torch.
TORCH_0122 := 2.0.1
TORCHAUDIO_0122 := 2.0.2
# The first Python 3.10 found: on PATH, then pyenv's, then a pyenv install that is not selected. Override with
# `make test-fairseq-0.12.2 PYTHON310=/path/to/python3.10`.
PYTHON310 ?= $(shell for py in python3.10 "$$(pyenv prefix 3.10 2>/dev/null)/bin/python3.10" \
	"$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/3.10*/bin/python3.10 /usr/bin/python3.10; do \
	"$$py" -c 'import sys; assert sys.version_info[:2] == (3, 10)' >/dev/null 2>&1 && { echo "$$py"; break; }; done)

.PHONY: help venv demo lint test test-fairseq-0.12.2 gpu-check gpu-bundle qa-device clean

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-22s %s\n", $$1, $$2}'

venv: $(VENV)/.installed ## Python 3.11 environment with fairseq-fixed, CPU torch and the dev tools

# torch goes in first, by exact version: this machine keeps its CPU wheel on disk, while a bare `torch` (asked for
# by fairseq) would pull a CUDA build of several GB from PyPI. fairseq builds C++/Cython extensions from source; it is
# built without build isolation, against the torch and numpy installed here, so that pip does not set up a second,
# CUDA torch in a temporary build environment and the extensions match the torch they are loaded into.
$(VENV)/.installed: setup.py Makefile
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install "numpy<2" torch==$(TORCH) setuptools wheel cython
	$(VENV)/bin/pip install --no-build-isolation "$(FAIRSEQ)"
	$(VENV)/bin/pip install -e ".[dev]"
	# fairseq asks for any torchaudio and pip takes the newest, built for another torch: it cannot load its library,
	# and transformers (a dev extra) imports torchaudio whenever it is installed. Nothing here uses audio.
	$(VENV)/bin/pip uninstall -y torchaudio
	touch $@

demo: venv ## train a tiny Cluster-Former LM on the committed WikiText-2 slice and print its perplexity
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash examples/demo.sh

# On a CUDA machine: writes benchmarks/results/gpu/ (about 55 minutes on one H100). On a CPU every part runs at tiny
# sizes into a temporary directory, or GPU_CHECK_OUT; benchmarks/gpu_check/README.md says what it measures.
GPU_CHECK_OUT ?=
GPU_CHECK_ARGS ?=
gpu-check: venv ## GPU validation + figures -> benchmarks/results/gpu/ (tiny on a CPU; GPU_CHECK_OUT=dir)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/python -m benchmarks.gpu_check $(if $(GPU_CHECK_OUT),--out "$(GPU_CHECK_OUT)") $(GPU_CHECK_ARGS)

# The wheels a lent GPU machine (Python 3.12, torch, no fairseq, no network) lacks, built with pyenv's Python 3.12;
# there `bash benchmarks/gpu_check/device_run.sh` installs them and runs gpu-check within its device budget.
gpu-bundle: ## wheels for the lent GPU machine -> .gpu-bundle/ (then benchmarks/gpu_check/device_run.sh there)
	bash benchmarks/gpu_check/bundle.sh

qa-device: venv ## table b's payload for the lent GPU machine -> .qa-device/ (then benchmarks/qa_device/device_run.sh there)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash benchmarks/qa_device/prepare.sh

lint: venv ## ruff check
	$(VENV)/bin/ruff check .

test: lint ## ruff, then the whole test suite (pass options with PYTEST_ARGS="...")
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/python -m pytest tests -q -ra $(XDIST) $(PYTEST_ARGS)

# Python 3.10 with the official fairseq 0.12.2 (it does not run on 3.11). Workarounds, in order:
# - pip < 24.1: fairseq pins omegaconf < 2.1, and omegaconf 2.0.6's metadata ("PyYAML>=5.1.*") is rejected by newer pip.
# - fairseq 0.12.2 is an sdist only for Python 3.10, and a broken one: its setup.py imports numpy (not declared in its
#   pyproject.toml, so an isolated build fails) and, when torch is importable, adds torch C++ extensions (libbase,
#   libnat, alignment_train) whose sources the sdist does not contain, so a build that sees torch fails too. It is
#   therefore built without isolation and --no-deps BEFORE torch is installed: setup.py then skips those extensions
#   (none of them is used by language modelling or QA) and builds libbleu and its two Cython modules.
# - PyPI has no CPU-only torch for Linux x86-64: every wheel there depends on NVIDIA's CUDA libraries. That is
#   accepted; the tests still run on the CPU.
$(VENV_0122)/.installed: setup.py Makefile
	@test -n "$(PYTHON310)" || { echo "Python 3.10 not found; pass PYTHON310=/path/to/python3.10" >&2; exit 1; }
	test -x $(VENV_0122)/bin/python || $(PYTHON310) -m venv $(VENV_0122)
	$(VENV_0122)/bin/pip install "pip<24.1"
	$(VENV_0122)/bin/pip install "numpy<2" setuptools wheel cython
	$(VENV_0122)/bin/pip install --no-build-isolation --no-deps fairseq==0.12.2
	$(VENV_0122)/bin/pip install torch==$(TORCH_0122) torchaudio==$(TORCHAUDIO_0122)
	$(VENV_0122)/bin/pip install -e ".[dev]"
	touch $@

test-fairseq-0.12.2: $(VENV_0122)/.installed ## end-to-end tests (-m e2e), Python 3.10 + official fairseq 0.12.2
	PATH="$(CURDIR)/$(VENV_0122)/bin:$$PATH" $(VENV_0122)/bin/python -m pytest tests -q -ra -m e2e $(XDIST) $(PYTEST_ARGS)

clean: ## remove both virtual environments (with their stamps) and build leftovers
	rm -rf $(VENV) $(VENV_0122) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
