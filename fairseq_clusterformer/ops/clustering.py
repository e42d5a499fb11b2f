"""Cluster assignment and the sort / unsort permutations of a Cluster-Former layer, and the one path every windowed
layer takes through them: sort, window, unsort (``sort_window_unsort``).

B = batch, T = tokens, C = channels, P = clusters.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def assign_clusters(states: Tensor, centroids: Tensor, padding_mask: Tensor | None = None) -> Tensor:
    """Cluster id of every state: argmax of the cosine with the centroids (paper eq. 4).

    states: B x T x C, centroids: P x C, padding_mask: B x T (True = pad).
    Returns a LongTensor B x T. Pad positions get id P, one past the last cluster, so that a
    stable sort moves them behind every real token and they never push a real token into
    another window. The cosine is computed in float32: in fp16/bf16, near-ties between
    neighbouring centroids would otherwise flip with rounding noise. Casting the inputs is not enough under
    ``torch.autocast``, which runs the matmul in half precision whatever its inputs are, so autocast is off here.
    """
    with torch.autocast(device_type=states.device.type, enabled=False):
        unit_states = torch.nn.functional.normalize(states.detach().float(), dim=-1)  # B x T x C
        unit_centroids = torch.nn.functional.normalize(centroids.detach().float(), dim=-1)  # P x C
        ids = torch.matmul(unit_states, unit_centroids.t()).argmax(dim=-1)  # B x T
    if padding_mask is not None:
        ids = ids.masked_fill(padding_mask, centroids.size(0))
    return ids


def nearest_ids(states: Tensor, centroids: Tensor, rows: int = 16384) -> Tensor:
    """Cosine-nearest centroid (P x C) of every state (N x C): N ids, computed ``rows`` states at a time so that a
    bank of 100k states never builds an N x P matrix at once."""
    unit_centroids = torch.nn.functional.normalize(centroids.detach().float(), dim=-1)  # P x C
    ids = [
        (torch.nn.functional.normalize(chunk.to(unit_centroids), dim=-1) @ unit_centroids.t()).argmax(dim=-1)
        for chunk in states.detach().split(rows)  # chunks of the bank, not of a sequence
    ]
    return torch.cat(ids) if ids else torch.zeros(0, dtype=torch.long, device=centroids.device)


def stable_sort(keys: Tensor) -> tuple[Tensor, Tensor]:
    """Sort ``keys`` (B x T) along T, ties kept in position order (paper eq. 5).

    Returns (sorted keys, order), both B x T, with ``sorted keys = gather(keys, order)``.
    Stability is what makes the sorted sequence list each cluster's tokens in their original
    order, which both the causal masks and the strict mode's band rely on.
    """
    result = torch.sort(keys, dim=1, stable=True)
    return result.values, result.indices


def inverse_permutation(order: Tensor) -> Tensor:
    """Inverse of a batch of permutations along the last dim (B x T, or B x H x T):
    ``gather(gather(x, order), inverse) == x``."""
    positions = torch.arange(order.size(-1), device=order.device).expand_as(order)  # like order
    return torch.empty_like(order).scatter_(-1, order, positions)


def _spread(order: Tensor, x: Tensor) -> Tensor:
    """order (the leading dims of x) broadcast over x's further dims, as ``torch.gather`` takes an index."""
    extra = x.dim() - order.dim()
    return order.reshape(*order.shape, *([1] * extra)).expand(*order.shape, *x.shape[order.dim() :])


class _Permutation(torch.autograd.Function):
    """``x`` gathered along ``order``'s last dim by the permutation ``order``; its gradient gathered back by the
    permutation's ``inverse``. A gather's own backward is a scatter-add into zeros: on a GPU atomic adds (and under
    ``torch.use_deterministic_algorithms`` a slower sorted path), on a CPU a serial loop, though no two positions of a
    permutation ever meet; a gather by the inverse gives the same gradient without them."""

    @staticmethod
    def forward(ctx, x: Tensor, order: Tensor, inverse: Tensor) -> Tensor:
        ctx.save_for_backward(inverse)
        return torch.gather(x, order.dim() - 1, _spread(order, x))

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inverse,) = ctx.saved_tensors
        return torch.gather(grad, inverse.dim() - 1, _spread(inverse, grad)), None, None


def permute_tokens(x: Tensor, order: Tensor, inverse: Tensor) -> Tensor:
    """x[b, order[b, t]] for x of shape B x T x ... and a permutation order B x T (or x[b, h, order[b, h, t]] for
    x: B x H x T x ... and order B x H x T), whose backward is a gather by ``inverse`` (``inverse_permutation``)."""
    return _Permutation.apply(x, order, inverse)


def gather_tokens(x: Tensor, order: Tensor) -> Tensor:
    """x[b, order[b, t]] for x of shape B x T x ... and order B x T (differentiable)."""
    index = order.reshape(*order.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])  # B x T x ...
    return torch.gather(x, 1, index)


def sorted_positions(valid: Tensor, order: Tensor | None) -> tuple[Tensor, Tensor]:
    """The original positions (B x T) and validity (B x T, False at pads) of the tokens sorted by the permutation
    ``order`` (B x T; None: the tokens as they are). Windows of a sorted sequence mask on these positions
    (``WindowScheme.mask``), so causality is judged in the input order, not in the sorted one."""
    if order is None:
        return torch.arange(valid.size(1), device=valid.device).expand_as(valid), valid  # B x T each
    return order, gather_tokens(valid, order)


def sort_window_unsort(
    tokens: Tensor,
    valid: Tensor,
    order: Tensor | None,
    windowed: Callable[[Tensor, Tensor, Tensor], Tensor],
) -> Tensor:
    """Run ``windowed`` on ``tokens`` (B x T x ...) sorted by the permutation ``order`` (B x T) and return its output
    in the input order (paper eq. 5, then eq. 7's unsort).

    windowed(sorted tokens, their validity B x T, their original positions B x T) returns one B x T x ... row per
    sorted token: it cuts the sorted sequence into windows, attends within them and merges them back. ``order`` None
    (a sliding window) runs it on the tokens as they are, nothing gathered. Every windowed path of the layers runs
    through here: the paper's windows (``WindowedTransformerLayer.run_windows``), the strict band (``run_band``), the
    hybrid layer's far branch and the flex backend; the statistics (``SortedWindowLayer.attention_layouts``) take
    the same positions from ``sorted_positions``.
    """
    positions, sorted_valid = sorted_positions(valid, order)
    if order is None:
        return windowed(tokens, sorted_valid, positions)
    inverse = inverse_permutation(order)  # B x T
    out = windowed(permute_tokens(tokens, order, inverse), sorted_valid, positions)  # B x T x ..., sorted
    return permute_tokens(out, inverse, order)


def cluster_counts(ids: Tensor, num_clusters: int, padding_mask: Tensor | None = None) -> Tensor:
    """Tokens per cluster (P,) LongTensor, pads (``padding_mask`` True, or id P) left out.

    Counted from the sorted ids: the run of cluster c lies between the first positions of c and of c + 1 in the
    sorted order (``searchsorted``). Unlike ``bincount`` this has a fixed output shape (``bincount`` reads the
    largest id back from the device) and is deterministic on a GPU (``bincount`` with weights adds floats with
    atomics and throws under ``torch.use_deterministic_algorithms(True)``).
    """
    flat = ids.reshape(-1)  # B*T
    if padding_mask is not None:
        flat = flat.masked_fill(padding_mask.reshape(-1), num_clusters)  # pads count in the extra cluster P
    edges = torch.arange(num_clusters + 1, device=ids.device, dtype=flat.dtype)  # P+1: 0..P
    starts = torch.searchsorted(torch.sort(flat).values, edges)  # P+1, first position of each id
    return starts[1:] - starts[:-1]  # P


def cluster_size_entropy(ids: Tensor, num_clusters: int, padding_mask: Tensor | None = None) -> Tensor:
    """Entropy (in bits) of the cluster-size histogram of real tokens: log2(P) when sizes are uniform,
    0 when every token falls into one cluster. A scalar float32 tensor (no host sync)."""
    counts = cluster_counts(ids, num_clusters, padding_mask).float()  # P
    probs = counts / counts.sum().clamp(min=1)
    return -(probs * torch.log2(probs.clamp(min=1e-12))).sum()
