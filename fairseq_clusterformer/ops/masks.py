"""Attention masks for windows, built from position tensors that travel with the states.

Every mask is boolean, True = may attend, shaped ... x Lq x Lk for queries ... x Lq and keys ... x Lk.
Every mask lets a query see itself, so no row is ever fully masked: a fully masked row makes the
softmax NaN, and a NaN in a discarded pad row still poisons the gradients through the merge.
"""

from __future__ import annotations

import torch
from torch import Tensor


def valid_tokens(x: Tensor, padding_mask: Tensor | None) -> Tensor:
    """B x T, False at pads, for states x (B x T x C) and fairseq's padding mask (B x T, True at pads, or None)."""
    return torch.ones_like(x[..., 0], dtype=torch.bool) if padding_mask is None else ~padding_mask


def window_mask(q_pos: Tensor, k_pos: Tensor, k_valid: Tensor, causal: bool) -> Tensor:
    """Mask for a window whose queries and keys carry their original sequence positions.

    Causal: key j is visible to query i iff pos_j <= pos_i. Because the positions are the original
    ones (gathered along with the states), the same rule serves plain sliding windows and the
    windows of a sorted (clustered) sequence. Positions must be unique within a window.
    """
    q = q_pos.unsqueeze(-1)  # ... x Lq x 1
    k = k_pos.unsqueeze(-2)  # ... x 1 x Lk
    allowed = k_valid.unsqueeze(-2)  # ... x 1 x Lk
    if causal:
        allowed = allowed & (k <= q)  # ... x Lq x Lk
    return allowed | (k == q)


def band_mask(q_rank: Tensor, k_rank: Tensor, q_ids: Tensor, k_ids: Tensor, k_valid: Tensor, reach: int) -> Tensor:
    """Strictly causal cluster mask on a sorted sequence.

    A query sees the keys of its own cluster whose sorted rank lies in (rank_q - reach, rank_q].
    A stable sort lists every cluster's tokens in position order, so these are the query itself
    and its ``reach - 1`` most recent predecessors of the same cluster: a set fixed by the past
    alone, unlike a window boundary, which moves with the count of later tokens of lower clusters.
    """
    offset = q_rank.unsqueeze(-1) - k_rank.unsqueeze(-2)  # ... x Lq x Lk
    same = q_ids.unsqueeze(-1) == k_ids.unsqueeze(-2)  # ... x Lq x Lk
    allowed = (offset >= 0) & (offset < reach) & same & k_valid.unsqueeze(-2)
    return allowed | (offset == 0)
