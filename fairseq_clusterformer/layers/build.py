"""Which layer a position of a model runs: a sliding-window layer, or its plan's long-range kind; and how the built
layers compute (``--compile-layers``, ``--attention-backend``), set on them once the model is built."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from fairseq_clusterformer.layers.baselines import LSHLayer, StridedSparseLayer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.compiled import check_compile_mode
from fairseq_clusterformer.layers.flex import check_attention_backend
from fairseq_clusterformer.layers.hybrid import HybridClusterFormerLayer, HybridLSHLayer, HybridSparseLayer
from fairseq_clusterformer.layers.settings import LayerSettings, LongRangePlan
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer, WindowedTransformerLayer


def build_layer(index: int, settings: LayerSettings, plan: LongRangePlan) -> nn.Module:
    """Layer number ``index`` (1-based) of a model with ``plan`` (checked when it was made). A layer that draws random
    numbers draws them from stream ``index`` of its own (``layers.streams``)."""
    if index not in plan.layers or plan.kind == "none":
        return SlidingWindowLayer(settings)
    hybrid = plan.mode == "hybrid"
    if plan.kind == "cluster":
        cluster = HybridClusterFormerLayer if hybrid else ClusterFormerLayer
        return cluster(settings, plan.num_clusters, plan.causality, plan.band_groups, plan.values, stream=index)
    if plan.kind == "lsh":
        lsh = HybridLSHLayer if hybrid else LSHLayer
        return lsh(settings, plan.num_clusters, plan.causality, plan.band_groups, plan.values, stream=index)
    return (HybridSparseLayer if hybrid else StridedSparseLayer)(settings, plan.causality, plan.values)


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
