"""Angular LSH buckets (Reformer, Kitaev et al. 2020) and the fixed-offset groups of the sparse baseline.

B = batch, T = tokens, C = channels, P = buckets.

Both produce a B x T LongTensor of group ids with pads at id P (one past the last group), the same contract as
``clustering.assign_clusters``, so every long-range layer shares one sort / window / unsort path.
"""

from __future__ import annotations

import torch
from torch import Tensor


def random_rotations(
    dim: int,
    num_buckets: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """C x P/2 Gaussian directions (P even, as a checked ``LongRangePlan`` has it); ``generator`` None draws from
    torch's global RNG (seeded by fairseq)."""
    return torch.randn(dim, num_buckets // 2, generator=generator, dtype=torch.float32, device=device)


def lsh_buckets(states: Tensor, rotations: Tensor, padding_mask: Tensor | None = None) -> Tensor:
    """Bucket of every state: argmax over [xR, -xR] (Reformer's angular hash); pads get P.

    states: B x T x C, rotations: C x P/2, padding_mask: B x T (True = pad). Computed in float32 for the same
    reason as the cosine of the cluster assignment: in half precision near-ties flip with rounding (and with
    autocast off, since ``torch.autocast`` would run the matmul in half precision whatever its inputs are).
    """
    with torch.autocast(device_type=states.device.type, enabled=False):
        projected = torch.matmul(states.detach().float(), rotations.to(states.device, torch.float32))  # B x T x P/2
    ids = torch.cat([projected, -projected], dim=-1).argmax(dim=-1)  # B x T
    if padding_mask is not None:
        ids = ids.masked_fill(padding_mask, 2 * rotations.size(1))
    return ids


def offset_groups(batch: int, length: int, period: int, padding_mask: Tensor | None = None, device=None) -> Tensor:
    """Group id ``t mod period`` of every position (the sparse baseline's strided pattern); pads get ``period``.

    Sorting by it lines up the tokens at the same offset inside their window, so that a window of the sorted
    sequence attends across windows at distances that are multiples of ``period``.
    """
    ids = (torch.arange(length, device=device) % period).expand(batch, length)  # B x T
    if padding_mask is not None:
        ids = ids.masked_fill(padding_mask, period)
    return ids
