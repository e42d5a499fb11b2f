"""The machine a benchmark ran on, written beside every figure: the CPU's model name (``cpu_model``), cores, memory
and software (``machine_info``, ``machine_markdown``), the GPU and its driver (``device_info``, ``device_line``), and
the machine's load while it ran (``LoadSampler``: the development machines are shared, so a timing comes with the
load it was measured under)."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import threading
import time

import torch

from benchmarks.common import GIB
from fairseq_clusterformer.ops.precision import bf16_is_slower, matmul_rates


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


def gpu_driver() -> str:
    """The NVIDIA driver version, from nvidia-smi (torch does not report it)."""
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"unknown (nvidia-smi: {err})"
    return out.strip().splitlines()[0] if out.strip() else "unknown (nvidia-smi printed nothing)"


def device_info(device: torch.device) -> dict:
    """The device's name and driver, and the software: the header of every GPU result file."""
    info = {
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "cpu": cpu_model(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=torch.cuda.get_device_name(device),
            driver=gpu_driver(),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
        )
    else:
        info.update(gpu=f"none: CPU run ({info['cpu']})", driver="none (no CUDA device)")
    try:
        import fairseq

        info["fairseq"] = fairseq.__version__
    except ImportError:
        info["fairseq"] = "not installed"
    return info


def device_line(info: dict) -> str:
    return (
        f"GPU: **{info['gpu']}**, driver {info['driver']}; torch {info['torch']} (CUDA {info['cuda']}), "
        f"fairseq {info['fairseq']}, Python {info['python']}, CPU {info['cpu']}; {info['date_utc']}."
    )


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


def machine_markdown(info: dict, load: dict) -> str:
    return (
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB RAM, torch {info['torch']} "
        f"({info['threads']} threads), Python {info['python']}. 1-minute load average during the run: "
        f"min {load['load_min']:.2f}, median {load['load_median']:.2f}, max {load['load_max']:.2f} "
        f"({load['load_samples']} samples); the machine is shared with other jobs."
    )


def matmul_record() -> dict[str, float | str]:
    """This CPU's float32 and bfloat16 product rates, one thread (GFLOP/s), as the records beside a run's seconds keep
    them: CPUs that print one model name differ, with native bfloat16 or without, and the rates tell them apart;
    ``bf16_products`` says how --autocast-bf16 multiplies here by default (``--bf16-products auto``): ``native`` or
    through ``float32`` kernels."""
    fp32, bf16 = matmul_rates()
    products = "float32" if bf16_is_slower(fp32, bf16) else "native"
    return {"float32": round(fp32, 1), "bfloat16": round(bf16, 1), "bf16_products": products}
