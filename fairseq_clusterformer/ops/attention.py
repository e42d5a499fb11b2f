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


# Extra head channels of the fused next-value attention: channel d carries the own score (queries), the extra
# slot's key and its indicator value; 8 keeps the widened head dim a multiple of 8, which fused CUDA kernels want.
_EXTRA = 8
# ``scale=`` arrived in torch 2.1 (setup.py allows 2.0.1); without it q is scaled to undo the default 1/sqrt(D)
_SDPA_HAS_SCALE = torch.__version__ >= (2, 1)


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
    query i (its own key, so no row is empty). Returns N x Lq x C. Dropout acts on the attention weights, the own
    key's included, as in ``masked_attention``.

    One fused ``scaled_dot_product_attention`` call, so the N x H x Lq x Lk float scores never exist where the
    backend fuses (CPU flash without dropout; CUDA memory-efficient where the torch version takes a mask): the own
    key slot is masked out and one extra key slot appended, whose score for query i is i's own score s_i and whose
    value is an indicator, so the output holds the next-value mix and, in the indicator channel, the own key's
    weight, which then scales ``own_v``. Putting s_i in a float mask entry would make the mask per head
    (N x H x Lq x (Lk+1)); instead the head dim grows by ``_EXTRA`` channels: query i carries s_i in channel d, the
    extra key carries sqrt(d) there and zeros elsewhere (the other keys zeros there), so with scale 1/sqrt(d) its
    score is s_i while every other score is unchanged. The mask stays a boolean N x 1 x Lq x (Lk+1) shared by the
    heads, and query i gets exactly zero weight and gradient from its own slot's ``next_v``. s_i is summed in
    float32 or wider (fp16 sums of large q . k products would overflow) and cast to q's dtype: it is then as large
    as any other score.
    FlexAttention (``return_lse``) would need torch 2.5, and merging a separate log-sum-exp needs a kernel that
    returns it; this works on every torch from 2.0.1.
    """
    n, lq, lk = q.size(0), q.size(1), k.size(1)
    if not 0 <= self_slot <= lk - lq:
        raise ValueError(f"own key slots {self_slot}..{self_slot + lq - 1} lie outside the {lk} keys")
    qh, kh, vh = split_heads(q, heads), split_heads(k, heads), split_heads(next_v, heads)  # N x H x L x d
    dim = qh.size(-1)
    rows = torch.arange(lq, device=q.device)
    acc = torch.promote_types(q.dtype, torch.float32)
    own_k = kh[:, :, self_slot : self_slot + lq]  # N x H x Lq x d, query i's own key
    own_score = (qh.to(acc) * own_k.to(acc)).sum(-1, keepdim=True) / dim**0.5  # N x H x Lq x 1
    zeros = qh.new_zeros(*qh.shape[:-1], _EXTRA - 1)  # N x H x Lq x (_EXTRA-1)
    q_wide = torch.cat([qh, own_score.to(q.dtype), zeros], dim=-1)  # N x H x Lq x (d+_EXTRA)
    slot = kh.new_zeros(n, heads, 1, dim + _EXTRA)  # N x H x 1 x (d+_EXTRA): the extra key slot, one-hot at d
    slot[..., dim] = 1.0
    widen = (0, _EXTRA)  # zero channels behind the d of every real key and value
    k_wide = torch.cat([torch.nn.functional.pad(kh, widen), slot * dim**0.5], dim=2)  # N x H x (Lk+1) x (d+_EXTRA)
    v_wide = torch.cat([torch.nn.functional.pad(vh, widen), slot], dim=2)  # N x H x (Lk+1) x (d+_EXTRA)
    mask = torch.cat([allowed, allowed[:, rows, self_slot + rows].unsqueeze(-1)], dim=-1)  # N x Lq x (Lk+1)
    mask[:, rows, self_slot + rows] = False  # the own key speaks through the extra slot only
    if _SDPA_HAS_SCALE:
        scaled = {"scale": dim**-0.5}
    else:
        q_wide, scaled = q_wide * ((dim + _EXTRA) / dim) ** 0.5, {}
    out = torch.nn.functional.scaled_dot_product_attention(
        q_wide, k_wide, v_wide, attn_mask=mask.unsqueeze(1), dropout_p=dropout_p, **scaled
    )  # N x H x Lq x (d+_EXTRA): the next-value mix in channels :d, the own key's weight in channel d
    return merge_heads(out[..., :dim] + out[..., dim : dim + 1] * split_heads(own_v, heads))


def reference_next_value_attention(
    q: Tensor,
    k: Tensor,
    next_v: Tensor,
    own_v: Tensor,
    allowed: Tensor,
    heads: int,
    self_slot: int,
    dropout_p: float = 0.0,
) -> Tensor:
    """``next_value_attention`` with the N x H x Lq x Lk scores and weights written out (float32 softmax), for
    tests and ``benchmarks/next_values.py``."""
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
