"""Every layer kind the model flags can build, for the tests of ``--compile-layers`` and ``--attention-backend``.

kind -> (--long-range-layer, --cluster-causality, --long-range-values, LayerSettings overrides).
"""

from __future__ import annotations

import torch

from fairseq_clusterformer.layers.build import build_layer
from fairseq_clusterformer.layers.kinds import LongRangePlan
from fairseq_clusterformer.layers.settings import LayerSettings

KINDS = {
    "window": ("none", "strict", "own", {}),
    "window-band": ("none", "strict", "own", {"sliding_windows": "band"}),
    "window-attention-merge": ("none", "strict", "own", {"window_merge": "attention"}),
    "cluster-strict": ("cluster", "strict", "own", {}),
    "cluster-paper": ("cluster", "paper", "own", {}),
    "cluster-paper-attention-merge": ("cluster", "paper", "own", {"window_merge": "attention"}),
    "cluster-strict-next": ("cluster", "strict", "next", {}),
    "lsh-strict": ("lsh", "strict", "own", {}),
    "sparse-strict": ("sparse", "strict", "own", {}),
    "cluster-bidirectional": ("cluster", "paper", "own", {"causal": False}),
    "window-bidirectional": ("none", "strict", "own", {"causal": False}),
}


def make(kind: str, dim: int, ffn: int, heads: int, window: int, stride: int, clusters: int) -> torch.nn.Module:
    """Layer 1 of a model whose flags give ``kind`` (strict mode in 3 groups, pre-norm, dropout 0), in training."""
    long_range, causality, values, extra = KINDS[kind]
    settings = LayerSettings(dim, ffn, heads, window, stride, normalize_before=True, **extra)
    plan = LongRangePlan(frozenset({1}), long_range, clusters, causality, band_groups=3, values=values)
    torch.manual_seed(0)
    return build_layer(1, settings, plan).train()
