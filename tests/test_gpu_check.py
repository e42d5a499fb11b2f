"""`make gpu-check` runs on the CPU at tiny sizes and writes every part's files, so it cannot rot before a GPU.

The command is the Makefile's own recipe (``make -n`` prints it), run with the output in a temporary directory:
the committed ``benchmarks/results/gpu/`` is for a GPU's results only, and a CPU run refuses to write there.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PARTS = ["tests", "train", "kmeans", "layers", "generation"]
COMMITTED = REPO / "benchmarks" / "results" / "gpu"
VENV = Path(sys.executable).parent.parent  # the environment running the tests, passed to make as VENV


def listing(path: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in path.rglob("*")} if path.exists() else {}


def make_recipe(*assignments: str) -> str:
    """The gpu-check recipe as make would run it; -o keeps make from rebuilding the environment when its stamp is
    older than the Makefile (the test runs in that environment already)."""
    command = ["make", "--no-print-directory", "-n", "-o", f"{VENV}/.installed", "gpu-check", f"VENV={VENV}"]
    proc = subprocess.run([*command, *assignments], cwd=REPO, capture_output=True, text=True, check=True)
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def gpu_check(tmp_path_factory):
    out, work = tmp_path_factory.mktemp("gpu-check") / "out", tmp_path_factory.mktemp("gpu-check-work")
    before = listing(COMMITTED)
    # --device cpu: on a machine with a GPU the test suite still runs the tiny CPU check, not the 40-minute one
    recipe = make_recipe(f"GPU_CHECK_OUT={out}", f"GPU_CHECK_ARGS=--work-dir {work} --device cpu")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", "-c", recipe], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert listing(COMMITTED) == before, "a CPU run of gpu-check wrote into benchmarks/results/gpu/"
    return out, proc, recipe


def read(out: Path, part: str) -> tuple[dict, str]:
    return json.loads((out / f"{part}.json").read_text()), (out / f"{part}.md").read_text()


def test_every_part_runs_and_names_the_device_in_every_file(gpu_check):
    out, proc, recipe = gpu_check
    assert "benchmarks/gpu_check" in recipe and "--out" in recipe
    assert proc.returncode == 0, f"{recipe}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["parts"]) == PARTS
    assert all(part["status"] == "ok" for part in summary["parts"].values()), summary["parts"]
    device = summary["machine"]["gpu"]
    assert device.startswith("none: CPU run") and summary["size"] == "tiny"
    for part in [*PARTS, "summary"]:
        record, markdown = read(out, part)
        assert record["machine"]["gpu"] == device and record["machine"]["driver"]
        assert device in markdown and record["machine"]["driver"] in markdown


def test_resume_is_identical_and_the_cpu_skips_are_recorded(gpu_check):
    record, markdown = read(gpu_check[0], "train")
    runs = {run["flag"]: run for run in record["runs"]}
    assert runs["--fp16"]["skipped"].startswith("skipped on cpu") and runs["--amp"]["skipped"].startswith("skipped")
    run = runs["--memory-efficient-fp16"]
    assert run["identical"] and run["resumed_at_stop"] and run["refreshed"]
    assert run["differences"] == {"model": 0, "task": 0, "optimizer": 0}
    assert "**identical**" in markdown


def test_each_part_recorded_its_figures(gpu_check):
    out = gpu_check[0]
    tests, _ = read(out, "tests")
    assert tests["counts"]["passed"] > 0 and not tests["failures"] and "passed" in tests["summary_line"]
    assert "--device cpu" in tests["command"]
    kmeans, _ = read(out, "kmeans")
    assert next(r for r in kmeans["refresh"] if r["backend"] == "torch")["median_s"] > 0
    assert any(s["swap_delay"] > 0 and "stall_max_step_s" in s for s in kmeans["stall"])
    layers, markdown = read(out, "layers")
    for kind in ["window", "cluster-strict", "cluster-paper", "cluster-strict next values", "sdpa-band"]:
        timed = [c for c in layers["cases"] if c["kind"] == kind and "median_s" in c]
        assert len(timed) == len(layers["shape"]["lengths"]), kind
    assert layers["references_vs_sdpa_band_max_abs"]["flex-window"] < 1e-4
    assert "flash-window" in markdown
    generation, _ = read(out, "generation")
    assert {r["model"] for r in generation["records"]} == {"cluster", "transformer_lm"}


def test_a_cpu_run_refuses_to_write_the_committed_gpu_results(tmp_path):
    before = listing(COMMITTED)
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu_check",
            "--device",
            "cpu",
            "--out",
            str(COMMITTED),
            "--work-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "would replace the GPU's" in proc.stderr
    assert listing(COMMITTED) == before
