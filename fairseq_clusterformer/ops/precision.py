"""bfloat16 where it pays: the layers' forward under ``torch.autocast``, and the machine's measured matmul rates.

On a CPU, bfloat16 is only faster where the processor multiplies it natively (AVX512-BF16, AMX): elsewhere torch
converts to float32 inside the product and bfloat16 runs slower than float32. ``matmul_rates`` measures both on the
machine at hand, so a flag that asks for bfloat16 can say which case this is instead of guessing from CPU flags.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
from torch import Tensor


@contextlib.contextmanager
def bf16_layers(x: Tensor, enabled: bool) -> Iterator[None]:
    """Run the enclosed layers under ``torch.autocast(bfloat16)`` on ``x``'s device when ``enabled``: matrix
    products and attention in bfloat16, layer norms and softmax in float32 (autocast's own lists). The caller turns
    the result back to float32 (``.float()``) so that heads, output projections and losses stay float32."""
    if not enabled:
        yield
        return
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        yield


def matmul_gflops(dtype: torch.dtype, size: int = 512, repeats: int = 5, device: str = "cpu") -> float:
    """GFLOP/s of a ``size`` x ``size`` matrix product in ``dtype`` on ``device``, the best of ``repeats`` after one
    warm-up; CPU time of this process on a CPU (other processes' load does not count), wall time on a GPU."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    cuda = torch.device(device).type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    best = float("inf")
    for i in range(repeats + 1):
        if cuda:
            torch.cuda.synchronize()
        start = clock()
        torch.mm(a, b)
        if cuda:
            torch.cuda.synchronize()
        if i:  # the first pass warms up
            best = min(best, clock() - start)
    return 2 * size**3 / max(best, 1e-9) / 1e9


def bf16_is_slower(fp32_gflops: float, bf16_gflops: float) -> bool:
    """Whether the measured rates are those of a device without native bfloat16: there torch converts inside every
    product and bfloat16 runs slower than float32 (down to a fiftieth), so asking for it slows a run down."""
    return bf16_gflops < fp32_gflops


def matmul_rates(size: int = 512, device: str = "cpu") -> tuple[float, float]:
    """(float32, bfloat16) matmul GFLOP/s on ``device``; on a CPU those of one thread: with several, a thread that
    waits for another one descheduled by a loaded machine spins and counts CPU time, which made bfloat16 measure
    slower than float32 on a loaded machine with native bfloat16 (a false warning)."""
    threads = torch.get_num_threads()
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)
    try:
        return matmul_gflops(torch.float32, size, device=device), matmul_gflops(torch.bfloat16, size, device=device)
    finally:
        torch.set_num_threads(threads)
