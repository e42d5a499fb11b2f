"""Which layer a position of a model runs: a sliding-window layer, or its plan's long-range kind."""

from __future__ import annotations

from torch import nn

from fairseq_clusterformer.layers.baselines import LSHLayer, StridedSparseLayer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.hybrid import HybridClusterFormerLayer, HybridLSHLayer, HybridSparseLayer
from fairseq_clusterformer.layers.settings import LayerSettings, LongRangePlan
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer


def build_layer(index: int, settings: LayerSettings, plan: LongRangePlan) -> nn.Module:
    """Layer number ``index`` (1-based) of a model with ``plan`` (checked when it was made)."""
    if index not in plan.layers or plan.kind == "none":
        return SlidingWindowLayer(settings)
    hybrid = plan.mode == "hybrid"
    if plan.kind == "cluster":
        cluster = HybridClusterFormerLayer if hybrid else ClusterFormerLayer
        return cluster(settings, plan.num_clusters, plan.causality, plan.band_groups, plan.values)
    if plan.kind == "lsh":
        lsh = HybridLSHLayer if hybrid else LSHLayer
        return lsh(settings, plan.num_clusters, plan.causality, plan.band_groups, plan.values)
    return (HybridSparseLayer if hybrid else StridedSparseLayer)(settings, plan.causality, plan.values)
