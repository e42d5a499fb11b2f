"""bfloat16 where it pays: the layers' forward under ``torch.autocast``, and the machine's measured matmul rates.

On a CPU, bfloat16 is only faster where the processor multiplies it natively (AVX512-BF16, AMX): elsewhere torch's
bfloat16 kernels run 10-100 times slower than float32's. ``matmul_rates`` measures both on the machine at hand, so
that a flag asking for bfloat16 can say which case this is instead of guessing from CPU flags, and ``bf16_products``
then runs the products of such a CPU through float32 kernels at bfloat16's rounding points
(``ops/bf16_products.py``): a bfloat16 run there keeps its numerics and goes at float32's speed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import torch
from torch import Tensor

from fairseq_clusterformer.ops.bf16_products import Bfloat16ProductsInFloat32

# how bfloat16 products run (--bf16-products): "auto" through float32 kernels where this device multiplies bfloat16
# slower than float32 (measured once a process), "native" always torch's bfloat16 kernels, "float32" always float32's
BF16_PRODUCTS = ("auto", "native", "float32")
_products = {"choice": "auto"}
_rates_seen: dict[str, tuple[float, float]] = {}
_inside = threading.local()  # whether this thread is inside a bf16_products region that entered the mode


@contextlib.contextmanager
def bf16_layers(x: Tensor, enabled: bool) -> Iterator[None]:
    """Run the enclosed layers under ``torch.autocast(bfloat16)`` on ``x``'s device when ``enabled``: matrix
    products and attention in bfloat16, layer norms and softmax in float32 (autocast's own lists). The caller turns
    the result back to float32 (``.float()``) so that heads, output projections and losses stay float32."""
    if not enabled:
        yield
        return
    with torch.autocast(x.device.type, dtype=torch.bfloat16), bf16_products(x.device.type):
        yield


def set_bf16_products(choice: str) -> None:
    """How the bfloat16 products of this process run from now on: one of ``BF16_PRODUCTS``."""
    if choice not in BF16_PRODUCTS:
        raise ValueError(f"--bf16-products {choice}: expected one of {', '.join(BF16_PRODUCTS)}")
    _products["choice"] = choice


def measured_rates(device_type: str) -> tuple[float, float]:
    """``matmul_rates`` of ``device_type``, measured once a process (a fraction of a second, longer where bfloat16
    is slow)."""
    if device_type not in _rates_seen:
        _rates_seen[device_type] = matmul_rates(device=device_type)
    return _rates_seen[device_type]


def products_through_float32(device_type: str) -> bool:
    """Whether bfloat16 products on ``device_type`` run through float32 kernels (only a CPU's can)."""
    choice = _products["choice"]
    if device_type != "cpu" or choice == "native":
        return False
    return choice == "float32" or bf16_is_slower(*measured_rates(device_type))


@contextlib.contextmanager
def bf16_products(device_type: str) -> Iterator[None]:
    """The region's bfloat16 products through float32 kernels where ``products_through_float32`` says so; in nested
    regions (a training step around the layers' own) the mode is entered once."""
    if getattr(_inside, "active", False) or not products_through_float32(device_type):
        yield
        return
    _inside.active = True
    try:
        with Bfloat16ProductsInFloat32():
            yield
    finally:
        _inside.active = False


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
