"""The bounded key/value caches of one generation step, and which cached keys each window lets the new token see.

B = batch, C = channels, l = window size, m = stride, W = windows containing the new token, L = cached keys,
R = rows of a grouped cache (head sets x groups), n = head sets.

Generation appends one token at position t per step. In a strictly causal layer the outputs of earlier positions
never change when tokens are appended, so a step only computes the new token's output, from the keys and values
it may attend to:
- a sliding window layer: windows start at the multiples of m in (t - l, t], and each sees the keys from its
  start to t; the ``l - 1`` most recent keys (plus the token's own) cover them all;
- a strict long-range layer: per head set, the token's group and the ``l - 1`` most recent earlier keys of that
  group; a FIFO per (head set, group) holds them.
Both caches keep a fixed number of entries, whatever the generated length.
"""

from __future__ import annotations

import torch
from torch import Tensor


def step_windows(position: int, size: int, stride: int) -> tuple[int, int]:
    """First and last window k (windows [k*m, k*m + l)) that contain ``position``; as ``ops.windows.coverage``."""
    first = max(0, (position - size) // stride + 1)
    return first, position // stride


def step_window_mask(position: int, keys: int, size: int, stride: int, device: torch.device | None = None) -> Tensor:
    """W x keys, True = attend: which of the ``keys`` most recent positions (ending with ``position`` itself) each
    window containing ``position`` lets it see. A causal window sees the keys from its start up to the query."""
    first, last = step_windows(position, size, stride)
    starts = torch.arange(first, last + 1, device=device) * stride  # W
    key_positions = torch.arange(position - keys + 1, position + 1, device=device)  # keys
    return key_positions[None, :] >= starts[:, None]  # W x keys


def push_recent(cache: Tensor | None, new: Tensor, keep: int) -> Tensor:
    """Append ``new`` (B x 1 x ...) to ``cache`` (B x L x ..., or None when empty) and keep the ``keep`` newest."""
    joined = new if cache is None else torch.cat([cache, new], dim=1)  # B x (L+1) x ...
    return joined[:, -keep:]


def empty_rows(batch: int, rows: int, keep: int, width: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """A grouped cache with nothing in it: keys and values B x R x keep x 2 x width (ring buffers, one per row), and
    the B x R count of the entries each row has received."""
    keys_values = like.new_zeros(batch, rows, keep, 2, width)  # B x R x keep x 2 x width
    return keys_values, torch.zeros(batch, rows, dtype=torch.long, device=like.device)


def gather_rows(cache: Tensor, rows: Tensor) -> Tensor:
    """The rows ``rows`` (B x n) of ``cache`` (B x R x ...): B x n x ..., a copy of those rows only."""
    batch = torch.arange(rows.size(0), device=rows.device)[:, None]  # B x 1, broadcast against B x n
    return cache[batch, rows]


def ring_filled(counts: Tensor, keep: int) -> Tensor:
    """B x n x keep, True at the slots of a ring buffer row that hold an entry, given its count (B x n)."""
    return torch.arange(keep, device=counts.device) < counts.unsqueeze(-1)


def push_rows(cache: Tensor, counts: Tensor, rows: Tensor, new: Tensor) -> None:
    """Write ``new`` (B x n x ...) into the ring buffer rows ``rows`` (B x n, distinct within a batch row) of
    ``cache`` (B x R x keep x ...), over each row's oldest entry once it is full, and count it in ``counts``
    (B x R). In place: a step touches n slots, and copying all R rows every step would cost the whole cache.
    Attention does not care in which order a row holds its keys."""
    batch = torch.arange(rows.size(0), device=rows.device)[:, None]  # B x 1
    seen = counts[batch, rows]  # B x n
    cache[batch, rows, seen % cache.size(2)] = new
    counts[batch, rows] = seen + 1
