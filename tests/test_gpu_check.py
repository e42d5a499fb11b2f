"""`make gpu-check` runs on the CPU at tiny sizes and writes every part's files, so it cannot rot before a GPU.

The command is the Makefile's own recipe (``make -n`` prints it), run with the output in a temporary directory:
the committed ``benchmarks/results/gpu/`` is for a GPU's results only, and a CPU run refuses to write there.
"""

import importlib
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO

PARTS = ["tests", "train", "kmeans", "layers", "generation", "model"]
COMMITTED = REPO / "benchmarks" / "results" / "gpu"
DEVICE_RUN = REPO / "benchmarks" / "gpu_check" / "device_run.sh"
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
    assert "-m benchmarks.gpu_check" in recipe and "--out" in recipe
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
        timed = [c for c in layers["cases"] if c["kind"] == kind and c["variant"] == "eager" and "median_s" in c]
        assert len(timed) == len(layers["shape"]["lengths"]), kind
    assert layers["references_vs_sdpa_band_max_abs"]["flex-window"] < 1e-4
    assert "flash-window" in markdown
    # the compiled variant runs its code path on the CPU (through aot_eager) and agrees with eager; flex is GPU-only
    compiled = [c for c in layers["cases"] if c["variant"] == "compiled" and "median_s" in c]
    assert {c["kind"] for c in compiled} == {"window", "cluster-strict"}
    assert all(max(c["vs_eager"].values()) < 1e-3 for c in compiled)
    assert all(c["skipped"].startswith("FlexAttention") for c in layers["cases"] if c["variant"] == "flex")
    model, markdown = read(out, "model")
    lengths = model["settings"]["lengths"]
    timed = [(c["model"], c["variant"], c["length"]) for c in model["cases"] if c.get("tokens_per_s", 0) > 0]
    # "auto", the default --compile-layers, runs eager on the CPU
    for name, variant in [
        ("cluster", "auto"),
        ("cluster", "compiled"),
        ("window", "auto"),
        ("transformer_lm", "eager"),
    ]:
        assert [t for m, v, t in timed if (m, v) == (name, variant)] == lengths, (name, variant)
    assert "sliding-window-only twin" in markdown
    generation, _ = read(out, "generation")
    assert {r["model"] for r in generation["records"]} == {"cluster", "transformer_lm"}


def test_a_cpu_run_refuses_to_write_the_committed_gpu_results(tmp_path):
    before = listing(COMMITTED)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check",
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


def benchmark_module(name: str):
    """A module of benchmarks/ (the driver is ``gpu_check.__main__``), for its size choice and estimates."""
    return importlib.import_module(f"benchmarks.{name}")


def test_the_budget_run_fits_the_device_call_and_a_long_budget_keeps_the_full_sizes():
    driver = benchmark_module("gpu_check.__main__")
    modules = {part: benchmark_module(f"gpu_check.part_{part}") for part in PARTS}
    gpu = driver.torch.device("cuda")  # only compared, never used: no GPU needed
    minutes = float(re.search(r"GPU_BUDGET_MINUTES:-([\d.]+)", DEVICE_RUN.read_text()).group(1))
    # what device_run.sh passes: the cut-down sizes run; each of the two calls its header names fits with a margin
    # inside the budget, and together they run every part
    assert driver.choose_size(driver.parse_args(["--budget-minutes", str(minutes)]), gpu, modules) == "budget"
    calls = re.findall(r'GPU_CHECK_ARGS="--parts ([a-z,]+)" bash', DEVICE_RUN.read_text())
    assert len(calls) == 2 and sorted(p for call in calls for p in call.split(",")) == sorted(PARTS)
    for call in calls:
        chosen = {part: modules[part] for part in call.split(",")}
        assert driver.choose_size(driver.parse_args(["--budget-minutes", str(minutes)]), gpu, chosen) == "budget"
        assert driver.estimate(chosen, "budget") <= 0.95 * 60 * minutes, call
    assert driver.estimate(modules, "budget") < driver.estimate(modules, "full")
    assert driver.choose_size(driver.parse_args(["--budget-minutes", "60"]), gpu, modules) == "full"
    assert driver.choose_size(driver.parse_args([]), gpu, modules) == "full"
    assert driver.choose_size(driver.parse_args(["--budget-minutes", "60"]), driver.torch.device("cpu"), modules) == (
        "tiny"
    )


def test_a_spent_budget_skips_every_part_without_failing(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--budget-minutes", "0", "--out", str(out)]
        + ["--work-dir", str(tmp_path / "work")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["parts"]) == PARTS and summary["budget_minutes"] == 0
    for part, record in summary["parts"].items():
        assert record["status"] == "skipped" and record["headline"].startswith("skipped: budget"), part
        assert json.loads((out / f"{part}.json").read_text())["status"] == "skipped"
    assert "0 of 6 parts ok, 6 skipped" in proc.stdout
    # without --device cpu a spent budget is not a dry run the user asked for: refused, naming the flag
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--budget-minutes", "0", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2 and "--budget-minutes 0: every part would be skipped" in proc.stderr, proc.stderr


def test_device_run_is_one_short_command_and_packs_its_results(tmp_path):
    # the command the device tool is given, as the script's header documents it
    command = re.search(r'run\(command="([^"]+)"', DEVICE_RUN.read_text()).group(1)
    assert command == "bash benchmarks/gpu_check/device_run.sh" and len(command) <= 2000
    out = tmp_path / "OUT"
    env = dict(os.environ, OMP_NUM_THREADS="1", OUT=str(out), PYTHON=sys.executable, SKIP_INSTALL="1")
    env.update(GPU_BUDGET_MINUTES="0", GPU_CHECK_ARGS="--device cpu")
    proc = subprocess.run(command.split(), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # what comes back from the device: at most 8 files; here the archive and the summary
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.tgz", "summary.md"]
    with tarfile.open(out / "gpu-check.tgz") as archive:
        names = archive.getnames()
        summary = json.load(archive.extractfile("results/summary.json"))
    assert {"device_run.log", "results/summary.md"} <= set(names)
    assert all(f"results/{part}.json" in names and f"results/{part}.md" in names for part in PARTS)
    assert all(record["status"] == "skipped" for record in summary["parts"].values())
    assert "gpu-check exit code: 0" in (out / "summary.md").read_text()


@pytest.mark.parametrize("size", ["tiny", "budget", "full"])
def test_every_train_schedule_stops_while_a_refresh_is_in_flight(size, tmp_path):
    """The stop/resume check only means something if a K-Means job started before the stop installs after it."""
    common = benchmark_module("gpu_check.context")
    train = benchmark_module("gpu_check.part_train")
    ctx = common.Context(tmp_path, tmp_path, train.torch.device("cpu"), size == "tiny", {}, size)
    args, updates, stop = train.schedule(ctx)
    value = {flag: int(args[args.index(flag) + 1]) for flag in ("--cluster-update-interval", "--kmeans-swap-delay")}
    interval, delay = value["--cluster-update-interval"], value["--kmeans-swap-delay"]
    started = stop // interval * interval  # refreshes start at every multiple of the interval
    assert 0 < started <= stop < started + delay <= updates, (size, interval, delay, stop, updates)
    assert args[args.index("--save-interval-updates") + 1] == str(stop)


# the next lent GPU's one call, as benchmarks/gpu_check/README.md gives it (docs/gpu_speed.md repeats it)
NEXT_RUN = re.compile(r"run\(command='GPU_CHECK_ARGS=\"([^\"]+)\" bash benchmarks/gpu_check/device_run\.sh'")


def next_run_args() -> str:
    readme = (REPO / "benchmarks" / "gpu_check" / "README.md").read_text()
    args = NEXT_RUN.search(readme.split("## The next GPU run", 1)[1]).group(1)
    assert f'GPU_CHECK_ARGS="{args}"' in (REPO / "docs" / "gpu_speed.md").read_text()
    return args


def test_the_next_gpu_run_fits_one_device_call():
    driver = benchmark_module("gpu_check.__main__")
    minutes = float(re.search(r"GPU_BUDGET_MINUTES:-([\d.]+)", DEVICE_RUN.read_text()).group(1))
    args = driver.parse_args(["--budget-minutes", str(minutes), *next_run_args().split()])
    modules = {part: benchmark_module(f"gpu_check.part_{part}") for part in args.parts.split(",")}
    gpu = driver.torch.device("cuda")  # only compared, never used
    assert driver.choose_size(args, gpu, modules) == "budget"
    assert driver.estimate(modules, "budget", driver.options(args)) <= 0.95 * 60 * minutes
    # device_run.sh stops the driver a minute past its budget: the call ends within 9 minutes and the device limit
    assert minutes + 1 <= 9


def test_the_next_gpu_run_dry_runs_on_the_cpu(tmp_path):
    out = tmp_path / "OUT"
    env = dict(os.environ, OMP_NUM_THREADS="1", OUT=str(out), PYTHON=sys.executable, SKIP_INSTALL="1")
    env["GPU_CHECK_ARGS"] = f"--device cpu {next_run_args()}"
    proc = subprocess.run(["bash", str(DEVICE_RUN)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(out / "gpu-check.tgz") as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    results = tmp_path / "unpacked" / "results"
    parts = json.loads((results / "summary.json").read_text())["parts"]
    assert [parts[p]["status"] for p in ("train", "model", "layers")] == ["skipped", "ok", "ok"], parts
    train, _ = read(results, "train")  # --fp16 needs a GPU: recorded as skipped, not failed
    assert [(r["flag"], r["skipped"][:15]) for r in train["runs"]] == [("--fp16", "skipped on cpu:")]
    model, _ = read(results, "model")
    timed = {(c["model"], c["variant"]) for c in model["cases"] if c.get("tokens_per_s", 0) > 0}
    assert {("cluster", "auto"), ("window", "auto"), ("transformer_lm", "eager")} <= timed
    layers, markdown = read(results, "layers")
    ours = {c["kind"] for c in layers["cases"]} - {"sdpa-band", "flex-window", "flash-window"}
    assert ours == {"cluster-paper", "cluster-strict next values"}
    compiled = [c for c in layers["cases"] if c["variant"] == "compiled"]
    assert compiled and all(max(c["vs_eager"].values()) < 1e-3 for c in compiled)
    profiled = {(c["kind"], c["variant"]): c for c in layers["profiles"]}
    assert list(profiled) == [("window", "compiled"), ("window band", "compiled"), ("cluster-strict", "compiled")] + [
        ("cluster-strict", "flex"),
        ("flex-window", "eager"),
    ]
    for key in [("window", "compiled"), ("window band", "compiled"), ("cluster-strict", "compiled")]:
        summary = profiled[key]["profile"]
        assert summary["calls_per_pass"] > 0 and summary["top"][0]["ms"] > 0, key
    assert all(
        "FlexAttention" in profiled[k]["skipped"] for k in [("cluster-strict", "flex"), ("flex-window", "eager")]
    )
    assert "## Profile at T = " in markdown and "--profile-layers" in (results / "summary.md").read_text()
