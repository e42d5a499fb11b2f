"""How far one K-Means refresh moved a layer's centroids, measured on the states it clustered.

N = banked states, P = clusters of the old centroids, Q = clusters of the new ones, C = model dim.

Two figures, both 1 for a refresh that changed nothing:

- ``nearest_cosine``: each new centroid's cosine with the old centroid nearest to it, averaged over the new ones.
  Indifferent to the order of the centroids (a refresh reorders them greedily), but blind to how many states a
  centroid holds.
- ``adjusted_rand_index`` of the banked states' clusters under the old centroids and under the new ones
  (``ops/clustering.nearest_ids`` of each). 1: the same states share a cluster (and so a sorted window) as before;
  0: as much alike as two random partitions with these cluster sizes. This is what attention sees: which tokens meet.

The first refresh compares K-Means' centroids with the random initial ones, so its figures are near 0 by
construction; from the second on they say whether the clusters are still moving.
"""

from __future__ import annotations

import torch
from torch import Tensor


def nearest_cosine(old: Tensor, new: Tensor) -> float:
    """Mean over the new centroids (Q x C) of the cosine with the nearest old centroid (P x C)."""
    unit_old = torch.nn.functional.normalize(old.detach().double(), dim=-1)  # P x C
    unit_new = torch.nn.functional.normalize(new.detach().to(unit_old), dim=-1)  # Q x C
    return float((unit_new @ unit_old.t()).amax(dim=-1).mean())  # Q -> 1


def _pairs(counts: Tensor) -> Tensor:
    """Pairs within each count: n (n - 1) / 2, in float64 (a bank of 100k states has 5e9 pairs)."""
    counts = counts.double()
    return (counts * (counts - 1) / 2).sum()


def adjusted_rand_index(first: Tensor, second: Tensor, first_count: int, second_count: int) -> float:
    """Adjusted Rand index (Hubert and Arabie) of two labellings of the same N items, ids in [0, first_count) and
    [0, second_count): from their contingency table, chance-corrected so that independent labellings score 0."""
    if first.shape != second.shape:
        raise ValueError(f"two labellings of different sizes: {tuple(first.shape)} and {tuple(second.shape)}")
    items = first.numel()
    if items < 2:
        return 1.0  # no pair to disagree on
    table = torch.bincount(first * second_count + second, minlength=first_count * second_count)  # P*Q counts
    table = table.view(first_count, second_count)  # P x Q
    together = _pairs(table)
    first_pairs, second_pairs = _pairs(table.sum(dim=1)), _pairs(table.sum(dim=0))
    expected = first_pairs * second_pairs / _pairs(torch.tensor([items]))
    best = (first_pairs + second_pairs) / 2
    if best == expected:  # both labellings put every item in one cluster, or both in singletons: identical
        return 1.0
    return float((together - expected) / (best - expected))
