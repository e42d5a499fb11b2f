import os
import subprocess
import sys
from pathlib import Path

# Under pytest-xdist (`make test` runs one worker per core) each worker gets its share of the cores as torch and
# OpenMP threads, set before torch is first imported (the package import below imports it): two workers of two
# threads each on two cores would spend their time waiting on each other's spinning threads. The end-to-end tests
# pass OMP_NUM_THREADS on to the fairseq processes they start.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import pytest  # noqa: E402

from fairseq_clusterformer.scripts.console_scripts import console_script

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "fairseq_clusterformer"
SLICE = Path(os.environ.get("CLUSTERFORMER_TEST_TEXT", REPO / "examples" / "data" / "wikitext-2-slice"))
BIN = Path(sys.executable).parent

# the tiny language model every end-to-end fairseq-train test starts from; each test adds its own schedule
TINY_LM_TRAIN = [
    "--user-dir", PACKAGE, "--task", "clusterformer_lm", "--arch", "clusterformer_lm_tiny",
    "--tokens-per-sample", "200", "--sample-break-mode", "none", "--optimizer", "adam", "--lr", "0.003",
    "--batch-size", "4", "--num-workers", "0",
]  # fmt: skip


def subprocess_env(**extra):
    """The environment for a fairseq process a test starts: this worker's share of the cores as its threads (two when
    the suite runs in one process on its own), with the tools of this environment first on PATH; `extra` comes last
    and may set OMP_NUM_THREADS itself."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "2")
    env.update(extra)
    return env


def run_cli(tool, *args, cwd=None, timeout=900):
    """Run a real fairseq console script (fairseq-train, fairseq-eval-lm, ...) and return its output."""
    env = subprocess_env(PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [console_script(tool), *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout


def run_ok(tool, *args, **kw):
    code, out = run_cli(tool, *args, **kw)
    assert code == 0, f"{tool} failed ({code}):\n{out[-4000:]}"
    return out


@pytest.fixture(scope="session")
def lm_data(tmp_path_factory):
    """The committed WikiText-2 slice, binarised by the real fairseq-preprocess."""
    dest = tmp_path_factory.mktemp("wikitext2") / "data-bin"
    run_ok(
        "fairseq-preprocess",
        "--only-source",
        "--trainpref",
        SLICE / "train.txt",
        "--validpref",
        SLICE / "valid.txt",
        "--testpref",
        SLICE / "test.txt",
        "--destdir",
        dest,
        "--workers",
        "1",
    )
    return dest


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="device for the tests that take the `device` fixture (cpu or cuda; `make gpu-check` passes cuda)",
    )


@pytest.fixture(scope="session")
def device(request):
    """The torch device of the device-independent tests (session scope: hypothesis tests take it too)."""
    import torch

    name = request.config.getoption("--device")
    try:
        dev = torch.device(name)
    except RuntimeError as err:
        raise pytest.UsageError(f"--device {name!r}: {err}") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {name}: this torch ({torch.__version__}) sees no CUDA device")
    return dev
