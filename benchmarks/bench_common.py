"""Helpers shared by the benchmark scripts: the machine, peak memory, subprocess workers, tables.

Peak memory is the process's peak resident set (VmHWM in /proc/self/status) after resetting it with
``/proc/self/clear_refs`` (Linux >= 4.0), measured in a fresh process per case: torch's CPU allocator returns large
blocks to the OS, so the peak resident set is the peak of live tensors plus the process's fixed footprint, which
the baseline read just before the measured work removes. tracemalloc cannot see torch's allocations.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from fairseq_clusterformer.scripts.console_scripts import console_script

GIB = 2**30
MIB = 2**20


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def machine_info() -> dict:
    """What the figures were measured on."""
    mem_total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(mem_total / GIB, 1),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


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


class LoadSampler:
    """Samples the 1-minute load average in the background while a benchmark runs (the machine is shared)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every_s)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        s = self.samples or [os.getloadavg()[0]]
        return {"load_min": min(s), "load_median": statistics.median(s), "load_max": max(s), "load_samples": len(s)}


def run_worker(script: Path, args: list[str], timeout: float) -> dict:
    """Run ``script --worker args`` in a fresh interpreter and return the JSON object on its last stdout line."""
    cmd = [sys.executable, str(script), "--worker", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


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
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


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


def machine_markdown(info: dict, load: dict) -> str:
    return (
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB RAM, torch {info['torch']} "
        f"({info['threads']} threads), Python {info['python']}. 1-minute load average during the run: "
        f"min {load['load_min']:.2f}, median {load['load_median']:.2f}, max {load['load_max']:.2f} "
        f"({load['load_samples']} samples); the machine is shared with other jobs."
    )


def matmul_gflops(n: int = 2048, repeats: int = 10) -> float:
    """This machine's float32 matrix-multiply rate for this process's threads: GFLOP/s of CPU time of the fastest of
    ``repeats`` products (the best, not the median: other jobs only ever slow a product down, and a floor should use
    what the machine can do)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    _, cpu = timed_repeats(lambda: a @ b, 1, repeats)
    return 2 * n**3 / min(cpu) / 1e9


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
