"""Which layer a position of a model runs: a sliding-window layer, or its plan's long-range kind (``layers.kinds``);
and how the built layers compute (``--compile-layers``, ``--attention-backend``), set on them once the model is
built."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from fairseq_clusterformer.layers.compiled import check_compile_mode
from fairseq_clusterformer.layers.flex import check_attention_backend
from fairseq_clusterformer.layers.kinds import NO_LONG_RANGE, LongRangePlan, long_range_kind
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer, WindowedTransformerLayer


def build_layer(index: int, settings: LayerSettings, plan: LongRangePlan) -> nn.Module:
    """Layer number ``index`` (1-based) of a model with ``plan`` (checked when it was made), its kind's class as
    ``layers.kinds`` says it is built. A layer that draws random numbers draws them from stream ``index`` of its own
    (``layers.streams``)."""
    if index not in plan.layers or plan.kind == NO_LONG_RANGE:
        return SlidingWindowLayer(settings)
    kind = long_range_kind(plan.kind)
    layer = kind.hybrid if plan.mode == "hybrid" else kind.layer
    if kind.grouped:
        return layer(settings, plan.num_clusters, plan.causality, plan.band_groups, plan.values, stream=index)
    return layer(settings, plan.causality, plan.values)


def configure_layers(layers: Iterable[nn.Module], compile_mode: str, attention_backend: str) -> int:
    """Set ``--compile-layers`` and ``--attention-backend`` on every windowed layer among ``layers`` (a model's
    ``modules()``); returns how many layers took them."""
    compile_mode = check_compile_mode(compile_mode)
    configured = 0
    for layer in layers:
        if isinstance(layer, WindowedTransformerLayer):
            check_attention_backend(attention_backend, layer.settings)
            layer.compile_mode, layer.attention_backend = compile_mode, attention_backend
            configured += 1
    return configured
