"""fairseq's own multi-process training (--distributed-world-size 2) on CPU over gloo, through fairseq-train's code.

fairseq 0.12 sizes its process spawn by the GPUs it sees (``nprocs=min(torch.cuda.device_count(), world_size)``) and
asserts ``world_size <= device_count`` when it picks the init method itself, so on a CPU-only machine it starts no
worker at all. The launcher below changes only that count, then runs fairseq's real ``cli_main``: fairseq spawns the
two workers (start method ``spawn``, as on GPUs), each re-imports the ``--user-dir`` package (fairseq issues #2143,
#4875), and trains with ``--cpu --distributed-backend gloo --ddp-backend legacy_ddp`` (PyTorch's DDP refuses the
``device_ids`` fairseq passes for a CPU model).
"""

import re
import socket
import sys

import pytest

from tests.conftest import TINY_LM_TRAIN, run_cli, run_ok

pytestmark = pytest.mark.e2e

LAUNCHER = """
import sys

import torch

if __name__ == "__main__":
    torch.cuda.device_count = lambda: {gpus}  # the only change: fairseq sizes its spawn by this count
    from fairseq_cli.train import cli_main

    sys.argv[0] = "fairseq-train"
    cli_main()
"""

TRAIN = [
    *TINY_LM_TRAIN,
    "--cpu",
    "--log-format",
    "simple",
    "--log-interval",
    "1",
    "--seed",
    "3",
    "--dropout",
    "0",
    "--memory-size",
    "3000",
    "--kmeans-iters",
    "10",
    "--no-save",
    "--max-update",
    "6",
    "--cluster-update-interval",
    "2",
    "--kmeans-swap-delay",
    "1",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def losses(output):
    return [float(x) for x in re.findall(r"train_inner\W.*? loss=([\d.]+)", output)]


def test_two_processes_train_like_one_process_with_twice_the_batch(lm_data, tmp_path):
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER.format(gpus=2))
    code, two = run_cli(
        "python",
        launcher,
        lm_data,
        *TRAIN,
        "--distributed-world-size",
        "2",
        "--distributed-backend",
        "gloo",
        "--distributed-init-method",
        f"tcp://localhost:{free_port()}",
        "--ddp-backend",
        "legacy_ddp",
    )
    assert code == 0, two[-4000:]
    assert "distributed init (rank 1)" in two
    # every install checks that the ranks agree (a checksum all-reduced across ranks), and says so
    assert two.count("centroids identical on all 2 ranks") == 2, two[-4000:]  # refreshes install at updates 3, 5
    # one process, two micro-batches per update: the same sentences per update as the two ranks together
    one = run_ok("fairseq-train", lm_data, *TRAIN, "--update-freq", "2")
    assert len(losses(two)) == len(losses(one)) == 6
    for a, b in zip(losses(two), losses(one)):
        assert a == pytest.approx(b, abs=2e-3), (losses(two), losses(one))
    assert re.findall(r"kmeans_refreshes=(\d+)", two)[-1] == "2"


def test_fairseq_refuses_more_cpu_workers_than_gpus_without_an_init_method(lm_data):
    # what a user sees with plain `fairseq-train --distributed-world-size 2 --cpu` on a machine without GPUs
    code, out = run_cli(sys.executable, "-m", "fairseq_cli.train", lm_data, *TRAIN, "--distributed-world-size", "2")
    assert code != 0
    assert "world size is 2 but have 0 available devices" in out
