"""How the `layers` and `model` parts run our layers: eager, compiled (``--compile-layers on``) and FlexAttention
(``--compile-layers on --attention-backend flex``), set on the built layers as the model flags set them.

On a CPU (the tiny dry run of the test suite) the compiled variant runs through AOT autograd without Inductor
(``aot_eager``): the compiled code path is exercised, but an Inductor build of every graph would take minutes on a
2-core machine, and CPU timings say nothing about a GPU anyway; FlexAttention has no backward pass on a CPU.
"""

from __future__ import annotations

import torch

from fairseq_clusterformer.layers.build import configure_layers
from fairseq_clusterformer.layers.compiled import COMPILE_OPTIONS
from fairseq_clusterformer.ops.flex_windows import flex_unavailable

# variant -> (--compile-layers, --attention-backend); "auto" is what the flags' defaults give (compiled on CUDA,
# eager elsewhere)
VARIANTS = {"eager": ("off", "eager"), "compiled": ("on", "eager"), "flex": ("on", "flex"), "auto": ("auto", "eager")}


def unavailable(variant: str, device: torch.device) -> str:
    """'' when ``variant`` can train here, else why not."""
    if variant == "flex" and flex_unavailable():
        return flex_unavailable()
    if variant == "flex" and device.type != "cuda":
        return "FlexAttention has no backward pass on a CPU"
    return ""


def apply(modules, variant: str, device: torch.device) -> str:
    """Set ``variant`` on every windowed layer among ``modules``; returns how it compiles ('' for eager)."""
    compile_mode, backend = VARIANTS[variant]
    compiles = compile_mode == "on" or (compile_mode == "auto" and device.type == "cuda")
    if compiles and device.type != "cuda":
        COMPILE_OPTIONS["backend"] = "aot_eager"
    configure_layers(modules, compile_mode, backend)
    return COMPILE_OPTIONS.get("backend", "inductor") if compiles else ""


def reset() -> None:
    """Forget every compiled graph, so that one case's compiles (and their cache entries) do not count in the next."""
    torch._dynamo.reset()
