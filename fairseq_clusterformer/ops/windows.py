"""Cutting a sequence into overlapping windows and merging the windows back.

B = batch, T = tokens, C = channels, K = windows, l = window size, m = stride.

Windows start at every multiple of the stride below T: window k covers positions [k*m, k*m + l).
The tail windows are padded past T. Defining the windows this way (rather than stopping once the
sequence is covered) makes the set of windows that contain a position t depend only on t, never
on T, so appending padding to a sequence never changes the outputs at its real positions; this is
what ``fairseq-eval-lm --context-window`` needs, because it right-pads its batches.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fairseq_clusterformer.ops.tracing import is_compiling


def num_windows(length: int, stride: int) -> int:
    """Number of windows K for a sequence of ``length`` tokens: one per stride start below ``length``."""
    return max(1, -(-length // stride))


def padded_length(length: int, size: int, stride: int) -> int:
    """Length the sequence is padded to so that the last window is complete."""
    return (num_windows(length, stride) - 1) * stride + size


def window_index(length: int, size: int, stride: int, device: torch.device | None = None) -> Tensor:
    """Positions covered by every window.

    Returns a LongTensor K x l of positions into the padded sequence (values < padded_length).
    """
    k = num_windows(length, stride)
    starts = torch.arange(k, device=device) * stride  # K
    return starts[:, None] + torch.arange(size, device=device)[None, :]  # K x l


def pad_to(x: Tensor, length: int, value: float | int | bool = 0) -> Tensor:
    """Right-pad dimension 1 of ``x`` (B x T x ...) to ``length``."""
    extra = length - x.size(1)
    if is_compiling():
        # compiled (``--compile-layers``) the length is symbolic: a branch on ``extra``, or an empty filler, would make
        # one graph for the lengths that are multiples of the stride and one for the others; ``pad`` makes one
        return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, extra), value=value)
    if extra <= 0:
        return x
    filler = x.new_full((x.size(0), extra, *x.shape[2:]), value)
    return torch.cat([x, filler], dim=1)


def unfold_windows(x: Tensor, size: int, stride: int) -> Tensor:
    """Cut B x Tp x ... (already padded to ``padded_length``) into B x K x l x ... windows.

    ``Tensor.unfold`` returns a strided view, so this copies nothing until the windows are used.
    """
    k = (x.size(1) - size) // stride + 1
    assert (k - 1) * stride + size == x.size(1), "pad the sequence with padded_length() first"
    windows = x.unfold(1, size, stride)  # B x K x ... x l
    return windows.movedim(-1, 2)  # B x K x l x ...


def band_key_windows(x: Tensor, size: int, stride: int, fill: float | int | bool = 0) -> Tensor:
    """Key windows for banded attention: query block k = [k*m, (k+1)*m) sees keys [k*m - (l-1), (k+1)*m).

    x is B x Tq x ... with Tq = K*m (padded with ``pad_to``). Returns B x K x (l - 1 + m) x ... ;
    the l - 1 slots before the sequence start hold ``fill`` (callers mask them).
    """
    reach = size - 1
    front = x.new_full((x.size(0), reach, *x.shape[2:]), fill)
    extended = torch.cat([front, x], dim=1)  # B x (l-1 + K*m) x ...
    windows = extended.unfold(1, reach + stride, stride)  # B x K x ... x (l-1+m)
    return windows.movedim(-1, 2)  # B x K x (l-1+m) x ...


def merge_windows(windows: Tensor, length: int, size: int, stride: int) -> Tensor:
    """Mean over the windows that contain each position (paper eq. 2, for any l/m ratio).

    windows: B x K x l x C; returns B x length x C. ``index_add_`` keeps this one batched kernel
    (and differentiable), whatever the number of windows.
    """
    bsz, k, _, channels = windows.shape
    index = window_index(length, size, stride, windows.device).reshape(-1)  # K*l
    total = windows.new_zeros(bsz, padded_length(length, size, stride), channels)
    total.index_add_(1, index, windows.reshape(bsz, k * size, channels))  # B x Tp x C
    # the coverage of K*m positions, a multiple of the stride, cut to T: the same values (a position's coverage does
    # not depend on T), but compiled by torch 2.13's Inductor for the CPU over a T that is not a multiple of the
    # stride, the training graph's loop left the last T mod m positions unwritten
    covered = coverage(k * stride, size, stride, windows.device, windows.dtype)[:length]  # T
    return total[:, :length] / covered[None, :, None]


def coverage(length: int, size: int, stride: int, device: torch.device | None, dtype: torch.dtype) -> Tensor:
    """How many windows contain each position 0..length-1 (a length vector, all >= 1)."""
    t = torch.arange(length, device=device)
    first = torch.clamp((t - size) // stride + 1, min=0)  # first window k with k*m + l > t
    last = t // stride  # last window k with k*m <= t
    return (last - first + 1).to(dtype)
