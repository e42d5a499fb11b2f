"""How far back a token last occurred, and the distance buckets the long-range breakdown scores by.

N = tokens of a split read as one stream, R = scored tokens.

A windowed language model can only use an earlier occurrence of the token it predicts when that occurrence lies
within what its layers can reach. The long-range breakdown (``fairseq-clusterformer-longrange``) therefore splits
the test loss by the distance to the previous occurrence of the same token in the same document:

- ``never``: the token does not occur earlier in its document;
- ``within reach``: it does, at most ``reach`` tokens back (what the stacked sliding windows can carry);
- ``beyond reach``: further back than ``reach`` but still inside the model's input;
- ``beyond input``: before the first token of the input the model was given, so no layer can see it.

Everything here is pure tensor logic, checked against brute-force loops in ``tests/test_longrange.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor

BUCKETS = ("never", "within reach", "beyond reach", "beyond input")
NEVER, WITHIN_REACH, BEYOND_REACH, BEYOND_INPUT = range(len(BUCKETS))


def previous_occurrence(tokens: Tensor, documents: Tensor | None = None) -> Tensor:
    """N positions: where ``tokens[j]`` last occurred before ``j`` in the same document, -1 where it did not.

    tokens: N token ids; documents: N document ids, non-decreasing (None: the whole stream is one document).
    """
    n = tokens.numel()
    positions = torch.arange(n, device=tokens.device)
    # one sort by (document, token, position) puts every occurrence right after the previous one of its kind;
    # the key packs the three into one int64 (documents x vocabulary x N stays far below 2^63 for real splits)
    documents = torch.zeros_like(tokens) if documents is None else documents
    key = (documents.long() * (int(tokens.max()) + 1) + tokens.long()) * n + positions  # N
    order = torch.sort(key).indices  # N: stream positions in key order
    same = (key[order][1:] // n) == (key[order][:-1] // n)  # N-1: neighbours in the order share document and token
    previous = torch.full((n,), -1, dtype=torch.long, device=tokens.device)
    previous[order[1:][same]] = order[:-1][same]
    return previous


def distance_buckets(targets: Tensor, previous: Tensor, input_starts: Tensor, reach: int) -> Tensor:
    """R bucket numbers (indices into ``BUCKETS``) of scored tokens.

    targets: R stream positions of the scored tokens; previous: N, from ``previous_occurrence``; input_starts: R,
    the stream position of the first token each scored token's input held; reach: the sliding-window stack's reach.
    Token j is predicted by the state that holds token j - 1, and an earlier occurrence p is held by its own state,
    so the windows must carry it j - 1 - p positions: ``within reach`` when that is at most ``reach``.
    """
    before = previous[targets]  # R
    buckets = torch.full_like(targets, BEYOND_REACH)
    buckets[targets - 1 - before <= reach] = WITHIN_REACH
    buckets[before < input_starts] = BEYOND_INPUT
    buckets[before < 0] = NEVER
    return buckets


def log2_bins(distances: Tensor) -> Tensor:
    """Bin b holds distances in [2^b, 2^(b+1)): ``floor(log2(d))`` for d >= 1 (the plot's x axis)."""
    return torch.floor(torch.log2(distances.clamp(min=1).double())).long()


def random_hit_chance(keys: Tensor, past: Tensor, targets: Tensor | int = 2) -> Tensor:
    """Chance that ``keys`` positions drawn at random without replacement from ``past`` positions include at least
    one of ``targets`` given positions: 1 - C(past - targets, keys) / C(past, keys), elementwise (``targets`` an int
    or a tensor broadcast with the others).

    The reference for the mechanism statistic: a long-range layer whose clusters ignored content would still hit
    an earlier occurrence this often, just by attending to as many keys.
    """
    past, keys = past.double(), keys.double().clamp(max=past)
    targets = torch.as_tensor(targets, device=past.device)
    miss = torch.ones_like(past)
    for i in range(int(targets.max())):  # C(a - t, k) / C(a, k) = prod_{i < t} (a - k - i) / (a - i)
        factor = ((past - keys - i) / (past - i)).clamp(min=0)
        miss = miss * torch.where(targets > i, factor, torch.ones_like(factor))
    return 1 - miss
