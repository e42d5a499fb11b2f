"""``--attention-backend flex``: the windowed layers' forward with their attention as one FlexAttention call.

The layers (``layers/windowed.py``, ``layers/sorted_window.py``) call these from their ``forward`` / ``attend`` when
``layer.attention_backend == "flex"``; the attention itself is ``ops.flex_windows``. Projections, residual, norms
and FFN are the layer's own modules, so both backends share every parameter and the state dict.

What FlexAttention cannot do here: attention dropout (it has no dropout on the attention weights: a training layer
with ``--attention-dropout`` > 0 refuses the backend) and a backward pass on the CPU (torch's CPU FlexAttention is
inference only: there the backend runs under ``torch.no_grad()`` only). The QA encoder's question + context window
layers (``qa.ops.windows``) keep the eager attention; its long-range layers take the backend.

B = batch, T = tokens, C = channels, r = window copies (``ops.flex_windows``), n = head sets.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from fairseq_clusterformer.layers.settings import LayerSettings, check_choice
from fairseq_clusterformer.ops.clustering import sort_window_unsort
from fairseq_clusterformer.ops.flex_windows import band_attention, copy_weights, flex_unavailable, window_attention
from fairseq_clusterformer.ops.masks import valid_tokens

ATTENTION_BACKENDS = ("eager", "flex")


def check_attention_backend(value: str, settings: LayerSettings | None = None) -> None:
    check_choice("--attention-backend", value, ATTENTION_BACKENDS)
    why = flex_unavailable() if value == "flex" else ""
    if why:
        raise ValueError(f"--attention-backend flex: {why}")


def _check_call(layer, x: Tensor) -> None:
    """Refuse what FlexAttention cannot compute, naming the flag (a silent fallback would time the wrong thing)."""
    if layer.training and layer.settings.attention_dropout > 0:
        raise ValueError(
            f"--attention-backend flex has no attention dropout, but --attention-dropout is "
            f"{layer.settings.attention_dropout:g}: train with --attention-dropout 0 or --attention-backend eager"
        )
    if not x.is_cuda and torch.is_grad_enabled():
        raise RuntimeError(
            "--attention-backend flex computes gradients on CUDA only (torch's FlexAttention has no backward pass on "
            "the CPU): run the CPU model under torch.no_grad(), or use --attention-backend eager"
        )


def _projections(layer, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (B x T x C each), as the eager paths project them."""
    h = layer.self_attn_layer_norm(x) if layer.settings.normalize_before else x
    proj = layer.self_attn
    return proj.q_proj(h), proj.k_proj(h), proj.v_proj(h)


def flex_band_forward(layer, x: Tensor, padding_mask: Tensor | None, orders: Tensor, sorted_groups: Tensor) -> Tensor:
    """``WindowedTransformerLayer.run_band`` of a strict long-range layer (orders, sorted_groups: n x B x T)."""
    _check_call(layer, x)
    q, k, v = _projections(layer, x)
    next_v = None
    if layer.values == "next":
        # position t holds the value of t + 1, zeros after the last token (as ``run_band``)
        next_v = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)  # B x T x C
    s = layer.settings
    attn = band_attention(q, k, v, s.heads, s.window_size, valid_tokens(x, padding_mask), orders, sorted_groups, next_v)
    return layer._finish(x, layer.self_attn.out_proj(attn))  # B x T x C


def flex_sliding_forward(layer, x: Tensor, padding_mask: Tensor | None) -> Tensor:
    """``SlidingWindowLayer.forward``: the band of every token's ``l - 1`` predecessors, or overlapping windows."""
    _check_call(layer, x)
    s = layer.settings
    if s.sliding_windows == "band":
        q, k, v = _projections(layer, x)
        attn = band_attention(q, k, v, s.heads, s.window_size, valid_tokens(x, padding_mask), None, None)  # B x T x C
        return layer._finish(x, layer.self_attn.out_proj(attn))
    return sort_window_unsort(x, valid_tokens(x, padding_mask), None, functools.partial(_overlapping_windows, layer))


def flex_windows_forward(layer, x: Tensor, padding_mask: Tensor | None, order: Tensor) -> Tensor:
    """``WindowedTransformerLayer.run_windows`` of a paper-mode (or bidirectional) long-range layer: overlapping
    windows of the sequence sorted by ``order`` (B x T)."""
    _check_call(layer, x)
    return sort_window_unsort(x, valid_tokens(x, padding_mask), order, functools.partial(_overlapping_windows, layer))


def _overlapping_windows(layer, x: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
    """x, valid, positions (B x T) in window order -> B x T x C: every window copy of every token, averaged over the
    windows that hold it, after the attention (``--window-merge attention``) or after the whole layer (``layer``)."""
    s = layer.settings
    q, k, v = _projections(layer, x)
    attn = window_attention(q, k, v, s.heads, s.window_size, s.window_stride, positions, valid, s.causal)
    weights = copy_weights(x.size(1), s.window_size, s.window_stride, x.device, x.dtype)[None, :, :, None]
    if s.window_merge == "attention":
        merged = (attn * weights.to(attn.dtype)).sum(1)  # B x T x C
        return layer._finish(x, layer.self_attn.out_proj(merged))
    y = layer._finish(x[:, None].expand_as(attn), layer.self_attn.out_proj(attn))  # B x r x T x C
    return (y * weights.to(y.dtype)).sum(1)  # B x T x C
