"""A fairseq decoder whose layers are sliding-window and long-range (Cluster-Former) layers.

B = batch, T = tokens, C = channels.
"""

from __future__ import annotations

import copy
import logging

import torch
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase
from torch import Tensor

from fairseq_clusterformer.layers.build import build_layer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.kinds import LongRangePlan
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.windowed import StepCache
from fairseq_clusterformer.ops.precision import bf16_layers

logger = logging.getLogger(__name__)

# the key of the decoder's generation cache in fairseq's incremental_state
CACHE_KEY = "window_cache"


class ClusterFormerDecoder(TransformerDecoderBase):
    """fairseq's transformer decoder (embeddings, positions, adaptive softmax, output projection) with
    windowed layers in place of full self-attention.

    Incremental decoding (fairseq-generate, fairseq-interactive, the hub's ``sample``): with ``incremental_state``
    the decoder runs only the tokens appended since the last call, each layer from a bounded cache of the keys and
    values the new token may attend to (``forward_step``), and returns their states alone, as fairseq's
    transformer does. A model with ``--cluster-causality paper`` layers is not causal, so no cache is exact: it
    recomputes the whole prefix at every step (and says so once). ``use_cache = False`` forces that full
    recomputation (tests and benchmarks compare the two).
    """

    use_cache = True

    def __init__(self, cfg: TransformerConfig, settings: LayerSettings, plan: LongRangePlan, dictionary, embed_tokens):
        # let the base class build everything but its own layers, then put ours in their place
        base_cfg = copy.deepcopy(cfg)
        base_cfg.decoder.layers = 0
        super().__init__(base_cfg, dictionary, embed_tokens, no_encoder_attn=True)
        self.cfg = cfg
        self.layers.extend(build_layer(i + 1, settings, plan) for i in range(cfg.decoder.layers))
        self.num_layers = len(self.layers)
        # --autocast-bf16 outside training (compat.autocast_bf16.set_bf16_layers): the layers in bfloat16, the output
        # projection in float32, since bfloat16 logits would move every log-probability by up to 0.4 % of a logit
        self.bf16_layers = False
        self._warned_uncached = False

    def long_range_layers(self) -> list[ClusterFormerLayer]:
        return [layer for layer in self.layers if isinstance(layer, ClusterFormerLayer)]

    def embed(self, tokens: Tensor, incremental_state=None) -> Tensor:
        """B x T tokens -> B x T x C input states (scaled embedding + positions, as fairseq's decoder); with
        ``incremental_state``, B x 1 x C of the last token only (fairseq's positions take the flag to mean that)."""
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(tokens, incremental_state=incremental_state)  # B x T x C, or B x 1 x C
        if incremental_state is not None:
            tokens = tokens[:, -1:]
        x = self.embed_scale * self.embed_tokens(tokens)  # B x T x C
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x = x + positions
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
        if incremental_state is not None and self.cacheable():
            return self.extract_features_cached(prev_output_tokens, incremental_state)
        tokens = prev_output_tokens.contiguous()
        padding_mask = tokens.eq(self.padding_idx)  # B x T
        x = self.embed(tokens)  # B x T x C
        inner_states = [x.transpose(0, 1)]  # fairseq reports T x B x C states
        with bf16_layers(x, self.bf16_layers):
            for layer in self.layers:
                x = layer(x, padding_mask)
                inner_states.append(x.transpose(0, 1))
        x = x.float() if self.bf16_layers else x
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [None], "inner_states": inner_states}

    def cacheable(self) -> bool:
        """Whether incremental decoding can use the layers' caches (it falls back to full recomputation if not)."""
        if not self.use_cache:
            return False
        if all(layer.cacheable for layer in self.layers):
            return True
        if not self._warned_uncached:
            logger.warning(
                "--cluster-causality paper is not causal, so generation has no exact cache: every step recomputes "
                "the whole prefix (quadratic in the length); train with --cluster-causality strict to generate in "
                "constant time per token"
            )
            self._warned_uncached = True
        return False

    def extract_features_cached(self, prev_output_tokens: Tensor, incremental_state):
        """Run the tokens of ``prev_output_tokens`` (B x T) that the cache has not seen, one at a time (fairseq's
        generator appends one per call); returns their B x T_new x C features.

        Pads are run as tokens: the generator only feeds them in beams it has already scored -inf (the spare beams
        while a prompt is forced), whose outputs it never uses."""
        cache = self.get_incremental_state(incremental_state, CACHE_KEY) or {}
        seen = cache.get("length", 0)  # a host int: reading a tensor here would be a host sync per step
        tokens = prev_output_tokens
        if tokens.size(1) <= seen:
            raise ValueError(
                f"incremental decoding got {tokens.size(1)} tokens after caching {seen}: it needs the cached prefix "
                "plus at least one new token (a fresh incremental_state starts a new sequence)"
            )
        caches = [
            {name[len(f"{i}.") :]: t for name, t in cache.items() if name.startswith(f"{i}.")}
            for i in range(self.num_layers)
        ]
        steps = []
        # one iteration per appended token: the generator appends one per call, so this loop runs once
        for position in range(seen, tokens.size(1)):
            x = self.embed(tokens[:, : position + 1], incremental_state)  # B x 1 x C
            states = [x]
            for i, layer in enumerate(self.layers):
                x, caches[i] = layer.forward_step(x, caches[i], position)
                states.append(x)
            steps.append(states)
        inner_states = [torch.cat(step, dim=1).transpose(0, 1) for step in zip(*steps)]  # T_new x B x C per layer
        x = inner_states[-1].transpose(0, 1)  # B x T_new x C
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        flat: StepCache = {f"{i}.{name}": t for i, layer_cache in enumerate(caches) for name, t in layer_cache.items()}
        flat["length"] = tokens.size(1)  # type: ignore[assignment]  # the one entry that is not a tensor
        self.set_incremental_state(incremental_state, CACHE_KEY, flat)
        return x, {"attn": [None], "inner_states": inner_states}

    def reorder_incremental_state(self, incremental_state, new_order: Tensor) -> None:
        """Beam search: pick the caches' batch rows (every cached tensor is batch first, but the length).

        ``new_order`` may be shorter than the cached batch: the generator drops the rows of finished sentences."""
        cache = self.get_incremental_state(incremental_state, CACHE_KEY)
        if cache is None:
            return
        rows = next((t.size(0) for name, t in cache.items() if name != "length"), None)
        if rows == new_order.numel() and torch.equal(new_order, torch.arange(rows, device=new_order.device)):
            return  # greedy search keeps every row in place at every step: copying the caches would be wasted
        reordered = {name: t if name == "length" else t.index_select(0, new_order) for name, t in cache.items()}
        self.set_incremental_state(incremental_state, CACHE_KEY, reordered)
