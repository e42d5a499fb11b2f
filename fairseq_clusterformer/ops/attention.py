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
