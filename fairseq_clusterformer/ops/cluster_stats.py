"""Statistics of what a long-range layer did: cluster sizes, members, and how far its attention reaches.

B = batch, T = tokens, K = windows, Lq / Lk = queries / keys per window, P = clusters (or buckets).

The attention statistics start from a layer's own window layout: the original positions of the queries and keys
of every window (as ``WindowScheme`` lays them out) and its boolean mask (``WindowScheme.mask``). Padded slots
carry positions outside ``[0, T)`` and are dropped, so the same functions serve plain sliding windows, the overlap
windows of a sorted sequence (paper causality) and the strict mode's bands.
"""

from __future__ import annotations

import torch
from torch import Tensor


def cluster_sizes(ids: Tensor, num_clusters: int) -> Tensor:
    """How many real tokens fall into each cluster: a LongTensor of P counts.

    ids: cluster ids of any shape; pads carry id P (or more) and are not counted.
    """
    flat = ids.reshape(-1)
    return torch.bincount(flat[flat < num_clusters], minlength=num_clusters)


def largest_clusters(sizes: Tensor, count: int) -> list[int]:
    """Ids of the ``count`` largest non-empty clusters, largest first (ties: lower id first)."""
    order = torch.sort(-sizes, stable=True).indices
    return [int(p) for p in order[:count] if sizes[p] > 0]


def cluster_positions(ids: Tensor, cluster: int) -> Tensor:
    """Positions (ascending) of the tokens of one sequence (ids: T) that fall into ``cluster``."""
    return torch.nonzero(ids == cluster).reshape(-1)


def attended_pairs(q_pos: Tensor, k_pos: Tensor, allowed: Tensor, length: int, valid: Tensor | None = None) -> Tensor:
    """Which token attends to which, over all windows: B x T x T bool, ``[b, i, j]`` = query i sees key j.

    q_pos: B x K x Lq and k_pos: B x K x Lk original positions of every window's queries and keys (padded slots
    anywhere outside [0, length)); allowed: B x K x Lq x Lk, the layer's attention mask; valid: B x T, False at
    pads. A pair that meets in several overlapping windows counts once.
    """
    q_real = (q_pos >= 0) & (q_pos < length)  # B x K x Lq
    k_real = (k_pos >= 0) & (k_pos < length)  # B x K x Lk
    hits = allowed & q_real.unsqueeze(-1) & k_real.unsqueeze(-2)  # B x K x Lq x Lk
    b, k, qi, kj = torch.nonzero(hits, as_tuple=True)
    pairs = torch.zeros(allowed.size(0), length, length, dtype=torch.bool, device=allowed.device)
    pairs[b, q_pos[b, k, qi], k_pos[b, k, kj]] = True
    if valid is not None:
        pairs &= valid.unsqueeze(-1) & valid.unsqueeze(-2)
    return pairs


def next_value_reads(pairs: Tensor) -> Tensor:
    """The states whose values a ``--long-range-values next`` layer reads, from its key pairs (... x T x T bool,
    ``[i, j]`` = query i sees key j): an earlier key j gives the value of j + 1, the query's own key its own."""
    own = torch.eye(pairs.size(-1), dtype=torch.bool, device=pairs.device)  # T x T
    earlier = pairs & ~own
    reads = torch.zeros_like(pairs)
    reads[..., 1:] = earlier[..., :-1]  # key j of query i -> value j + 1 (<= i, as j < i)
    return reads | (pairs & own)


def attention_distances(pairs: Tensor) -> Tensor:
    """Query position minus key position for every attending pair of ``pairs`` (... x T x T): a 1-D LongTensor.

    Non-negative for a causal layer; 0 is a token attending to itself.
    """
    found = torch.nonzero(pairs)  # N x pairs.dim(): the last two columns are query and key
    return found[:, -2] - found[:, -1]


def window_reach(window_size: int, layers: int = 1) -> int:
    """How far back ``layers`` stacked causal sliding-window layers can carry information: each adds l - 1."""
    return layers * (window_size - 1)


def fraction_beyond(distances: Tensor, reach: int) -> float:
    """Share of the distances larger than ``reach`` (0.0 for no distances)."""
    if distances.numel() == 0:
        return 0.0
    return float((distances > reach).float().mean())
