"""Statistics of what a long-range layer did: cluster sizes, members, and how far its attention reaches.

B = batch, T = tokens, K = windows, Lq / Lk = queries / keys per window, P = clusters (or buckets).

The attention statistics start from a layer's own window layout: the original positions of the queries and keys
of every window (as ``WindowScheme`` lays them out) and its boolean mask (``WindowScheme.mask``). Padded slots
carry positions outside ``[0, T)`` and are dropped, so the same functions serve plain sliding windows, the overlap
windows of a sorted sequence (paper causality) and the strict mode's bands.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def attended_rows(
    q_pos: Tensor, k_pos: Tensor, allowed: Tensor, length: int, rows: Tensor, valid: Tensor | None = None
) -> Tensor:
    """``attended_pairs(...)[:, rows]`` without building the B x T x T matrix: B x N x T bool, ``[b, n, j]`` = the
    query at position ``rows[n]`` sees key j. rows: N distinct positions in [0, length); the other arguments as in
    ``attended_pairs``. For the few query positions of a long sequence (a question's tokens among 10k context ones).
    """
    device = allowed.device
    row_of = torch.full((length + 1,), -1, dtype=torch.long, device=device)  # T+1: position -> row, -1 = not asked
    row_of[rows] = torch.arange(rows.numel(), device=device)
    q_real = (q_pos >= 0) & (q_pos < length)  # B x K x Lq
    q_row = torch.where(q_real, row_of[q_pos.clamp(0, length)], -1)  # B x K x Lq: padded slots are never rows
    k_real = (k_pos >= 0) & (k_pos < length)  # B x K x Lk
    hits = allowed & (q_row >= 0).unsqueeze(-1) & k_real.unsqueeze(-2)  # B x K x Lq x Lk
    b, k, qi, kj = torch.nonzero(hits, as_tuple=True)
    pairs = torch.zeros(allowed.size(0), rows.numel(), length, dtype=torch.bool, device=device)  # B x N x T
    pairs[b, q_row[b, k, qi], k_pos[b, k, kj]] = True
    if valid is not None:
        pairs &= valid[:, rows].unsqueeze(-1) & valid.unsqueeze(-2)
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


def keys_inside(pairs: Tensor, queries: Tensor, sets: Sequence[Sequence[Tensor]]) -> Tensor:
    """How many attended (query, key) pairs of ``pairs`` have their query in ``queries`` and their key in every key
    set of ``sets[m]`` (an empty entry: every key): a B x M LongTensor, one column per entry of ``sets``.

    pairs: B x N x T (``[b, i, j]`` = query i sees key j, as ``attended_pairs`` gives it, N = T; or only some of
    its query rows, as ``attended_rows`` gives them); queries: B x N bool; each key set B x T bool (one set for every
    query, e.g. a paragraph) or B x N x T bool (a set per query, e.g. outside the query's own sliding window). A
    share of keys inside a span is ``keys_inside(.., [[span], []])``'s first column over its second. The pairs are
    listed once and every set is read at them: no B x N x T temporaries, which a 10k-token sequence makes slow.
    """
    b, i, j = torch.nonzero(pairs & queries.unsqueeze(-1), as_tuple=True)  # one entry per counted pair
    counts = []
    for key_sets in sets:
        hit = torch.ones_like(b, dtype=torch.bool)
        for keys in key_sets:
            hit &= keys[b, j] if keys.dim() == 2 else keys[b, i, j]
        counts.append(torch.bincount(b[hit], minlength=pairs.size(0)))  # B
    return torch.stack(counts, dim=1) if counts else b.new_zeros(pairs.size(0), 0)


def span_mask(length: int, spans: list[tuple[int, int]]) -> Tensor:
    """T bool, True at the positions of the half-open ``[start, stop)`` spans (overlaps count once)."""
    mask = torch.zeros(length, dtype=torch.bool)
    for start, stop in spans:
        if not 0 <= start <= stop <= length:
            raise ValueError(f"span [{start}, {stop}) does not fit in {length} positions")
        mask[start:stop] = True
    return mask


def paragraphs_of(starts: list[int], length: int, positions: list[int]) -> list[tuple[int, int]]:
    """The half-open ``[start, stop)`` paragraphs that hold ``positions``, each once, in order: paragraph p runs from
    its marker ``starts[p]`` to the next marker (or ``length``). A position before the first marker has none."""
    found = []
    for p, start in enumerate(starts):
        stop = starts[p + 1] if p + 1 < len(starts) else length
        if any(start <= position < stop for position in positions):
            found.append((start, stop))
    return found


def size_summary(sizes: Tensor) -> tuple[float, float, int]:
    """(entropy of the size histogram in bits, the largest cluster's share, how many clusters are empty) of
    ``cluster_sizes`` output (P counts); a histogram of no tokens has entropy 0 and largest share 0."""
    total = int(sizes.sum())
    empty = int((sizes == 0).sum())
    if total == 0:
        return 0.0, 0.0, empty
    probs = sizes.double() / total
    entropy = -(probs * torch.log2(probs.clamp(min=1e-300))).sum()  # an empty cluster adds 0 * log 0 = 0
    return float(entropy), float(probs.max()), empty
