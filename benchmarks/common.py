"""What every benchmark shares: the one timer (``stopwatch``: wall and CPU seconds of a block, on a CPU or a CUDA
device) and the repeated timings built on it, peak memory, subprocess workers, result files (JSON lines, markdown
tables), the layers' shape flags and the character-level data. The machine a figure was measured on: ``machine.py``.
The matmul rate a floor is computed from is the package's (``ops/precision.py``).

Peak memory is the process's peak resident set (VmHWM in /proc/self/status) after resetting it with
``/proc/self/clear_refs`` (Linux >= 4.0), measured in a fresh process per case: torch's CPU allocator returns large
blocks to the OS, so the peak resident set is the peak of live tensors plus the process's fixed footprint, which
the baseline read just before the measured work removes. tracemalloc cannot see torch's allocations.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from fairseq_clusterformer.scripts.console_scripts import console_script

GIB = 2**30
MIB = 2**20


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> int:
    """Reset this process's peak resident set to its current one; returns the current resident set in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS") * 1024


def peak_rss() -> int:
    """Peak resident set in bytes since the last ``reset_peak_rss``."""
    return _status_kib("VmHWM") * 1024


def run_worker(module: str, args: list[str], timeout: float) -> dict:
    """Run ``python -m module --worker args`` in a fresh interpreter (from the repository root, where the benchmarks
    package is found) and return the JSON object on its last stdout line."""
    cmd = [sys.executable, "-m", module, "--worker", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


@dataclass
class Stopwatch:
    """Seconds of one timed region, set when the region ends: ``wall`` on the wall clock, ``cpu`` of this process."""

    wall: float = float("nan")
    cpu: float = float("nan")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def stopwatch(device: torch.device | str | None = None) -> Iterator[Stopwatch]:
    """Time the ``with`` block: ``with stopwatch() as took: ...`` then ``took.wall`` and ``took.cpu`` in seconds.

    The one timer of every benchmark. On a CUDA ``device`` it waits for the device before starting and before
    stopping, so that the clocks count the block's kernels finishing, not only their queueing, and no work queued
    before the block. ``cpu`` is ``time.process_time``: every thread of this process, not the time the scheduler
    gave to other jobs, and no time spent asleep or waiting for a subprocess.
    """
    device = None if device is None else torch.device(device)
    took = Stopwatch()
    if device is not None:
        sync(device)
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
        yield took
    finally:  # also when the block raises: how long a failed attempt took is still there to report
        if device is not None:
            sync(device)
        took.wall, took.cpu = time.perf_counter() - start, time.process_time() - start_cpu


def timed_repeats(step, warmup: int, repeats: int) -> tuple[list[float], list[float]]:
    """(wall seconds, process CPU seconds) of ``repeats`` calls of ``step()`` after ``warmup`` untimed calls.

    On a shared machine the wall time also counts the time the scheduler gave to other jobs; the CPU time of a
    single-threaded process (OMP_NUM_THREADS=1) is the compute the step needed, which other jobs inflate far less
    (only through shared caches and memory bandwidth).
    """
    for _ in range(warmup):
        step()
    wall, cpu = [], []
    for _ in range(repeats):
        with stopwatch() as took:
            step()
        wall.append(took.wall)
        cpu.append(took.cpu)
    return wall, cpu


def time_step(step, device: torch.device, warmup: int, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``step()`` after ``warmup`` untimed ones: CUDA events around the
    call on a GPU (the GPU's time, not the time to queue its kernels), the wall clock on a CPU."""
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1000)
        else:
            with stopwatch() as took:
                step()
            times.append(took.wall)
    return times


def peak_bytes(step, device: torch.device) -> int | None:
    """Peak device memory of one ``step()`` above what was allocated before it (None on a CPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def append_jsonl(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def markdown_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The shape of one layer and its seed, as every layer benchmark takes them (``layer_builder.build`` reads them)."""
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--window", type=int, default=256, help="window size l")
    p.add_argument("--stride", type=int, default=128, help="window stride m")
    p.add_argument("--clusters", type=int, default=512, help="clusters (LSH: buckets) of the long-range layers")
    p.add_argument("--groups", type=int, default=6, help="strict mode's groups of clusters (3,072 / (2 x 256) = 6)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout and activation dropout of every layer")
    p.add_argument("--attention-dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1, help="torch's seed before the layer is built")


def parse_shape_args(argv: list[str]) -> argparse.Namespace:
    """The shape flags alone (what a benchmark's own parser left over)."""
    p = argparse.ArgumentParser(description="the layer's shape")
    add_shape_args(p)
    return p.parse_args(argv)


REPO = Path(__file__).resolve().parent.parent
CHAR_SOURCE = REPO / "examples" / "data" / "tinyshakespeare" / "input.txt"


def prepare_char_data(work_dir: Path, held_out_bytes: int = 55_000) -> Path:
    """Tiny Shakespeare read as bytes, one token per byte (enwik8's format), binarised by fairseq-preprocess.

    Returns the data-bin directory; reuses it when it is already there.
    """
    dest = work_dir / "chars-bin"
    if (dest / "train.bin").exists() and (dest / "test.bin").exists():
        return dest
    if not CHAR_SOURCE.is_file():
        raise FileNotFoundError(f"no character-level text at {CHAR_SOURCE}")
    text = work_dir / "chars-text"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "fairseq_clusterformer.scripts.lm.prepare_enwik8",
            "--input",
            str(CHAR_SOURCE),
            "--out-dir",
            str(text),
            "--valid-bytes",
            str(held_out_bytes),
            "--test-bytes",
            str(held_out_bytes),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            console_script("fairseq-preprocess"),
            "--only-source",
            "--trainpref",
            str(text / "train.txt"),
            "--validpref",
            str(text / "valid.txt"),
            "--testpref",
            str(text / "test.txt"),
            "--destdir",
            str(dest),
            "--workers",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    return dest
