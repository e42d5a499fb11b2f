"""A fairseq decoder whose layers are sliding-window and long-range (Cluster-Former) layers.

B = batch, T = tokens, C = channels.
"""

from __future__ import annotations

import copy

from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase
from torch import Tensor, nn

from fairseq_clusterformer.modules.baseline_layers import LSHLayer, StridedSparseLayer
from fairseq_clusterformer.modules.cluster_layer import ClusterFormerLayer
from fairseq_clusterformer.modules.layer_settings import (
    LONG_RANGE_CHOICES,
    LayerSettings,
    LongRangePlan,
    parse_layer_list,
)
from fairseq_clusterformer.modules.windowed_layer import SlidingWindowLayer

__all__ = ["LONG_RANGE_CHOICES", "ClusterFormerDecoder", "LongRangePlan", "build_layer", "parse_layer_list"]


def build_layer(index: int, settings: LayerSettings, plan: LongRangePlan) -> nn.Module:
    """Layer number ``index`` (1-based) of a model with ``plan`` (checked when it was made)."""
    if index not in plan.layers or plan.kind == "none":
        return SlidingWindowLayer(settings)
    if plan.kind == "cluster":
        return ClusterFormerLayer(settings, plan.num_clusters, plan.causality, plan.band_groups)
    if plan.kind == "lsh":
        return LSHLayer(settings, plan.num_clusters, plan.causality, plan.band_groups)
    return StridedSparseLayer(settings, plan.causality)


class ClusterFormerDecoder(TransformerDecoderBase):
    """fairseq's transformer decoder (embeddings, positions, adaptive softmax, output projection) with
    windowed layers in place of full self-attention.

    Incremental decoding is not cached: with ``incremental_state`` the whole prefix is recomputed
    and every position returned, which is what fairseq's sequence generator slices the last step from.
    """

    def __init__(self, cfg: TransformerConfig, settings: LayerSettings, plan: LongRangePlan, dictionary, embed_tokens):
        # let the base class build everything but its own layers, then put ours in their place
        base_cfg = copy.deepcopy(cfg)
        base_cfg.decoder.layers = 0
        super().__init__(base_cfg, dictionary, embed_tokens, no_encoder_attn=True)
        self.cfg = cfg
        self.layers.extend(build_layer(i + 1, settings, plan) for i in range(cfg.decoder.layers))
        self.num_layers = len(self.layers)

    def long_range_layers(self) -> list[ClusterFormerLayer]:
        return [layer for layer in self.layers if isinstance(layer, ClusterFormerLayer)]

    def embed(self, tokens: Tensor) -> Tensor:
        """B x T tokens -> B x T x C input states (scaled embedding + positions, as fairseq's decoder)."""
        x = self.embed_scale * self.embed_tokens(tokens)  # B x T x C
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if self.embed_positions is not None:
            x = x + self.embed_positions(tokens)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout_module(x)

    def extract_features_scriptable(
        self,
        prev_output_tokens: Tensor,
        encoder_out=None,
        incremental_state=None,
        full_context_alignment: bool = False,
        alignment_layer=None,
        alignment_heads=None,
    ):
        tokens = prev_output_tokens.contiguous()
        padding_mask = tokens.eq(self.padding_idx)  # B x T
        x = self.embed(tokens)  # B x T x C
        inner_states = [x.transpose(0, 1)]  # fairseq reports T x B x C states
        for layer in self.layers:
            x = layer(x, padding_mask)
            inner_states.append(x.transpose(0, 1))
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [None], "inner_states": inner_states}
