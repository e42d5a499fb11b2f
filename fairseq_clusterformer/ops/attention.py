"""Multi-head attention over a batch of windows.

N = windows in the batch (B*K), H = heads, d = head dim, C = H*d, Lq / Lk = queries / keys per window.
"""

from __future__ import annotations

import torch
from torch import Tensor


def split_heads(x: Tensor, heads: int) -> Tensor:
    """N x L x C -> N x H x L x d."""
    n, length, channels = x.shape
    return x.reshape(n, length, heads, channels // heads).transpose(1, 2)  # N x H x L x d


def merge_heads(x: Tensor) -> Tensor:
    """N x H x L x d -> N x L x C."""
    n, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(n, length, heads * dim)  # N x L x C


def masked_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, heads: int, dropout_p: float = 0.0) -> Tensor:
    """Scaled dot-product attention of N windows under a boolean mask.

    q: N x Lq x C, k / v: N x Lk x C, allowed: N x Lq x Lk (True = attend; every row must allow at
    least one key, which the masks in ``ops.masks`` guarantee). Returns N x Lq x C.
    The fused kernel keeps the N x H x Lq x Lk scores out of memory where the backend allows it,
    and takes the boolean mask as is, so fp16/bf16 need no dtype-specific fill value.
    """
    out = torch.nn.functional.scaled_dot_product_attention(
        split_heads(q, heads),
        split_heads(k, heads),
        split_heads(v, heads),
        attn_mask=allowed.unsqueeze(1),  # N x 1 x Lq x Lk, shared by the heads
        dropout_p=dropout_p,
    )  # N x H x Lq x d
    return merge_heads(out)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, heads: int) -> Tensor:
    """The same computation written out with an explicit softmax (for tests)."""
    qh, kh, vh = split_heads(q, heads), split_heads(k, heads), split_heads(v, heads)
    scores = qh @ kh.transpose(-1, -2) / qh.size(-1) ** 0.5  # N x H x Lq x Lk
    scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    return merge_heads(torch.softmax(scores, dim=-1) @ vh)


def next_value_attention(
    q: Tensor,
    k: Tensor,
    next_v: Tensor,
    own_v: Tensor,
    allowed: Tensor,
    heads: int,
    self_slot: int,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention in which every key but the query's own contributes ``next_v`` (the value of the token after it)
    and the query's own key contributes ``own_v`` (a token's next value is a later token's: it would leak).

    q, own_v: N x Lq x C; k, next_v: N x Lk x C; allowed: N x Lq x Lk, True at key slot ``self_slot + i`` for
    query i (its own key, so no row is empty). Returns N x Lq x C. The scores are written out, not fused: the
    own key's weight is needed apart from the others.
    """
    lq, lk = q.size(1), k.size(1)
    qh, kh = split_heads(q, heads), split_heads(k, heads)  # N x H x Lq x d, N x H x Lk x d
    scores = qh @ kh.transpose(-1, -2) / qh.size(-1) ** 0.5  # N x H x Lq x Lk
    # fp16/bf16 scores are softmaxed in float32
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)).masked_fill(
        ~allowed.unsqueeze(1), float("-inf")
    )
    weights = torch.softmax(scores, dim=-1).to(q.dtype)  # N x H x Lq x Lk
    if dropout_p > 0:
        weights = torch.nn.functional.dropout(weights, p=dropout_p)
    rows = torch.arange(lq, device=q.device)
    own = torch.zeros(lq, lk, dtype=torch.bool, device=q.device)  # Lq x Lk, True at each query's own key
    own[rows, self_slot + rows] = True
    mixed = weights.masked_fill(own, 0.0) @ split_heads(next_v, heads)  # N x H x Lq x d
    mixed = mixed + weights[..., rows, self_slot + rows].unsqueeze(-1) * split_heads(own_v, heads)
    return merge_heads(mixed)
