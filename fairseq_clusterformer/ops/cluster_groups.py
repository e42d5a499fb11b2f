"""Groups of neighbouring clusters for the strictly causal long-range layer.

B = batch, T = tokens, P = clusters, n = groupings (head sets), G = groups (--cluster-groups): the unshifted grouping
has G, each shifted one G + 1 (a part of a group at either end).

Why groups: a strictly causal layer may only let token t see keys chosen by tokens <= t. Paper mode cuts the
cluster-sorted sequence into windows, whose boundaries move with the number of *later* tokens in lower clusters
(the leak). Cutting instead at fixed points of the cluster order - consecutive clusters of the greedy order form a
group - gives boundaries that no token can move: a token's group is a function of its cluster alone. Inside its
group a token attends to itself and the ``l - 1`` most recent earlier tokens of the group (the band), so every key
set depends on the past only.

The cut points balance the groups by token count, using each cluster's share of the memory bank (measured when
K-Means fits the centroids, so it is a fixed buffer, not a statistic of the current input): a group then holds
about ``T / G`` tokens of a T-token segment whatever the cluster sizes. Groupings ``j = 0..n-1`` are shifted by
``j / n`` of a group, so a cluster that sits at a boundary of one grouping sits inside a group of another; each
grouping serves its own set of heads (paper mode gets the same effect from windows that overlap by half).
"""

from __future__ import annotations

import torch
from torch import Tensor


def segment_groups(tokens_per_sample: int, window_size: int) -> int:
    """Groups of about two windows' worth of tokens at the training segment length: with the band's reach of one
    window, a token then sees about as many keys as paper mode's two overlapping windows let it see."""
    return max(1, round(tokens_per_sample / (2 * window_size)))


def default_groups(tokens_per_sample: int, window_size: int, num_clusters: int) -> int:
    """The group count that --cluster-groups 0 stands for: ``segment_groups``, at most one group per cluster (a
    group is a run of at least one cluster, so more groups than clusters cannot be cut). Only an explicit
    --cluster-groups above --num-clusters is an error: the user never chose this one."""
    return min(segment_groups(tokens_per_sample, window_size), num_clusters)


def uniform_shares(num_clusters: int, device: torch.device | None = None) -> Tensor:
    """Equal shares (P,), float32: the shares before the first K-Means refresh, and LSH's (balanced by design)."""
    return torch.full((num_clusters,), 1.0 / num_clusters, device=device)


def cluster_shares(ids: Tensor, num_clusters: int) -> Tensor:
    """Share of the banked states in each cluster, from their cluster ids (N, ``ops/clustering.nearest_ids``): P
    floats summing to 1."""
    counts = torch.bincount(ids, minlength=num_clusters).double()  # P
    return (counts / counts.sum().clamp(min=1)).float()


def cluster_to_group(shares: Tensor, groups: int, groupings: int) -> Tensor:
    """Group of every cluster in every grouping: n x P LongTensor, values in 0..G.

    Cluster c covers [start_c, start_c + share_c) of [0, total) (clusters in greedy order); it joins the group its
    centre falls in, in grouping j shifted by j/n of a group. Groups are runs of consecutive clusters.
    Computed on the CPU in float64 with a sequential running sum, so that equal shares, whose centres can land
    exactly on a cut, are cut the same way on every device (callers cache the table: it changes only with shares).
    """
    shares = shares.detach().to("cpu", torch.float64).clamp(min=0)  # P
    ends = torch.cumsum(shares, 0)  # P, sequential on the CPU
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])  # P
    total = ends[-1].clamp(min=1e-12)
    centres = (starts + shares / 2) / total  # P, in (0, 1)
    shifts = torch.arange(groupings, dtype=torch.float64) / groupings  # n
    scaled = centres[None, :] * groups + shifts[:, None]  # n x P
    return scaled.floor().long().clamp(max=groups)  # n x P


def band_group_ids(
    ids: Tensor, table: Tensor, padding_mask: Tensor | None = None, pad_group: int | None = None
) -> Tensor:
    """Map cluster ids (B x T, pads at P) to group ids per grouping: n x B x T, pads one past the last group.

    table: n x P from ``cluster_to_group``; its values stay <= G, so G + 1 is free for the pads, which a stable
    sort then moves behind every real token (they must never take a slot inside a real group's band).
    pad_group: ``table.max() + 1``, which a caller that caches the table passes along with it: reading the max of a
    table on the GPU would make the host wait for the device in every forward. None: read it here.
    """
    if pad_group is None:
        pad_group = int(table.max()) + 1 if table.numel() else 0
    padded_table = torch.cat([table, table.new_full((table.size(0), 1), pad_group)], dim=1)  # n x (P+1)
    flat = padded_table[:, ids.clamp(max=table.size(1)).reshape(-1)]  # n x (B*T)
    out = flat.view(table.size(0), *ids.shape)  # n x B x T
    if padding_mask is not None:
        out = out.masked_fill(padding_mask[None], pad_group)
    return out
