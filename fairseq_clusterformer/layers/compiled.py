"""``--compile-layers``: run the windowed and long-range layers' forward through ``torch.compile(fullgraph=True)``.

Why: on a GPU one forward + backward of a Cluster-Former layer dispatches hundreds of small ATen ops, almost none of
which is big enough to keep the GPU busy, so the layers cost what their kernel launches cost. Compiled, the same layer
is a few dozen fused kernels (the counts: docs/gpu_speed.md, from ``benchmarks/ops_per_layer.py``).

What is compiled: the methods decorated with ``compilable`` (the sliding-window layer's ``forward``, the sorted-window
layers' ``attend`` - everything but ``observe``, which keeps the cluster-size entropy for the logs - and the QA
encoder's window pass; the memory banks watch the layers through forward pre-hooks, which run outside it). They are
compiled as plain functions of the layer, not by wrapping the module, so the layers' parameter names, ``state_dict``,
pickling and ``copy.deepcopy`` are those of the eager model. Layers of one class share one compiled graph (dynamo treats
the module as an input: its parameters are graph inputs, its settings guards). The cached one-token generation step
(``forward_step``) stays eager: it is a different, tiny graph per step.

Lengths: torch's automatic dynamic shapes. The first call compiles for its exact sizes (a training run with a fixed
``--tokens-per-sample`` compiles once); a call with another length recompiles with the length symbolic, one with
another batch size with that symbolic too, and a batch of one once more (torch specialises sizes of 1): at most four
graphs per layer kind, whatever the lengths (``tests/test_compiled_layers.py`` counts them; ``docs/gpu_speed.md``
says why this was chosen over bucketed lengths). The window schemes avoid the branches on T that would add graphs
(``ops.windows.pad_to``, ``WindowScheme.count``).

B = batch, T = tokens, C = channels.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

from fairseq_clusterformer.ops.tracing import is_compiling

logger = logging.getLogger(__name__)

# "auto": on where the layer's input is on a CUDA device, the LM's and the QA model's default: compiling pays on a GPU
# and not on a CPU, where it costs minutes of C++ builds (the timings: docs/gpu_speed.md). Checkpoints that recorded
# "off" keep it when they are loaded
COMPILE_CHOICES = ("off", "on", "auto")
DEFAULT_COMPILE = "auto"

F = TypeVar("F", bound=Callable)
# what ``torch.compile`` is given, read at each decorated function's first compiled call. Benchmarks on a CPU set
# "backend": "aot_eager" to run the compiled code path without waiting minutes for Inductor's C++ builds
COMPILE_OPTIONS: dict = {"fullgraph": True}


def check_compile_mode(value: str) -> str:
    """The mode the layers run: ``value``, or "off" for the default "auto" on a torch too old to compile them."""
    if value not in COMPILE_CHOICES:
        raise ValueError(f"--compile-layers must be one of {COMPILE_CHOICES}, got {value!r}")
    if value != "off" and not hasattr(getattr(torch, "compiler", None), "is_compiling"):
        # the window schemes take their one-graph-for-every-length form only where torch says it is tracing
        if value == "auto":  # the default must not refuse the official fairseq 0.12.2 environment (torch 2.0)
            logger.info("--compile-layers auto: torch %s is older than 2.3, the layers run eager", torch.__version__)
            return "off"
        raise ValueError(f"--compile-layers {value} needs torch >= 2.3, this is torch {torch.__version__}")
    return value


def wants_compile(mode: str, x: Tensor) -> bool:
    """Whether a layer in ``mode`` runs its compiled forward for input ``x``."""
    return mode == "on" or (mode == "auto" and x.is_cuda)


def compilable(fn: F) -> F:
    """Decorate a layer method (or a function whose first argument is a layer, whose second is its B x T x C input)
    that is a pure function of its tensors: it then runs compiled whenever ``layer.compile_mode`` asks for it.

    One ``torch.compile`` per decorated function, made on first use (a module that never compiles never pays for
    it). Inside a region being compiled (a whole model under ``torch.compile``) the function runs as written, so
    dynamo traces it as part of that region.
    """
    compiled: list[Callable] = []

    @functools.wraps(fn)
    def run(layer, x, *args, **kwargs):
        if not wants_compile(layer.compile_mode, x) or is_compiling():
            return fn(layer, x, *args, **kwargs)
        if not compiled:
            compiled.append(torch.compile(fn, **COMPILE_OPTIONS))
        return compiled[0](layer, x, *args, **kwargs)

    run.uncompiled = fn  # type: ignore[attr-defined]  # for torch._dynamo.explain in the tests and benchmarks
    return run  # type: ignore[return-value]
