"""The benchmarks' layers: one layer of each kind, built from the shape flags (``common.add_shape_args``) as the
package builds it, plus fairseq's full-attention decoder layer; every benchmark that times or counts a layer takes it
from here, so that all of them measure the same layers.

C = channels, F = FFN dim, H = heads.
"""

from __future__ import annotations

import dataclasses

import torch


def available_kinds() -> list[str]:
    """The kinds measured by default: fairseq's full attention, the sliding window, the kinds with K-Means clusters
    (Cluster-Former) in both causality modes and every other kind of ``layers.kinds`` in strict mode (``--kinds
    lsh-paper`` and the like add the rest); with ``--window-merge`` support, the sliding window and the paper-mode
    Cluster-Former again with attention-only merging (suffix ``:attention``; strict mode's band windows do not
    overlap, so it has nothing to merge)."""
    from fairseq_clusterformer.layers.kinds import KINDS, LongRangePlan
    from fairseq_clusterformer.layers.settings import CAUSALITY_CHOICES, LayerSettings

    kinds = ["full", "window"]
    for name, kind in KINDS.items():
        kinds += [f"{name}-{mode}" for mode in CAUSALITY_CHOICES] if kind.uses_clusters else [f"{name}-strict"]
    if "window_merge" in _field_names(LayerSettings) | _field_names(LongRangePlan):
        kinds += [f"{k}:attention" for k in ("window", "cluster-paper") if k in kinds]
    return kinds


def _field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _filtered(cls, **values):
    """Build dataclass ``cls`` from the values it has fields for (the plan's fields grow as layers are added)."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def build(kind: str, args) -> torch.nn.Module:
    if kind == "full":
        from fairseq.models.transformer import TransformerConfig
        from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

        cfg = TransformerConfig()
        cfg.decoder.embed_dim, cfg.decoder.ffn_embed_dim = args.dim, args.ffn
        cfg.decoder.attention_heads, cfg.decoder.normalize_before = args.heads, True
        cfg.dropout, cfg.attention_dropout, cfg.activation_dropout = args.dropout, args.attention_dropout, args.dropout
        return TransformerDecoderLayerBase(cfg, no_encoder_attn=True)

    from fairseq_clusterformer.layers.build import build_layer
    from fairseq_clusterformer.layers.kinds import LongRangePlan
    from fairseq_clusterformer.layers.settings import LayerSettings

    base, _, merge = kind.partition(":")
    merge = merge or "layer"
    # "window-band": the sliding window as --sliding-windows band (each token and its l - 1 predecessors, one FFN
    # pass per token), the pattern of benchmarks/gpu_check's FlexAttention reference
    sliding = "band" if base == "window-band" else "overlap"
    base = "window" if base == "window-band" else base
    settings = _filtered(
        LayerSettings,
        embed_dim=args.dim,
        ffn_dim=args.ffn,
        heads=args.heads,
        window_size=args.window,
        window_stride=args.stride,
        causal=True,
        normalize_before=True,
        dropout=args.dropout,
        attention_dropout=args.attention_dropout,
        activation_dropout=args.dropout,
        window_merge=merge,
        sliding_windows=sliding,
    )
    long_range, _, causality = base.partition("-")
    plan = _filtered(
        LongRangePlan,
        layers=frozenset({1}),
        kind="none" if long_range == "window" else long_range,
        num_clusters=args.clusters,
        causality=causality or "strict",
        window_merge=merge,
        band_groups=args.groups,
        values=getattr(args, "long_range_values", "own"),  # benchmarks/gpu_check times --long-range-values next
    )
    return build_layer(1, settings, plan)
