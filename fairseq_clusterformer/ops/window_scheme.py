"""How a (possibly sorted) sequence is cut into attention windows, and how the windows come back.

B = batch, T = tokens, K = windows, l = window size, m = stride, Lq / Lk = queries / keys per window.

``Windowing`` is what a windowed layer asks of a scheme; two schemes here serve every layer of the language model
(the QA model's own, ``qa.ops.windows``, have the same interface):
- ``overlap`` (the paper): windows [k*m, k*m + l) serve as queries and keys; a token that sits in
  several windows gets the mean of its outputs (Lq = Lk = l).
- ``band`` (strict causality): query block [k*m, (k+1)*m) attends to keys [k*m - (l-1), (k+1)*m);
  every token is a query exactly once, so nothing is merged (Lq = m, Lk = l - 1 + m).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from fairseq_clusterformer.ops.masks import band_mask, window_mask
from fairseq_clusterformer.ops.tracing import is_compiling
from fairseq_clusterformer.ops.windows import (
    band_key_windows,
    merge_windows,
    num_windows,
    pad_to,
    padded_length,
    unfold_windows,
)


@runtime_checkable
class Windowing(Protocol):
    """How a windowed layer cuts a B x T x ... sequence into K windows and merges the K windows back."""

    @property
    def count(self) -> int:
        """K, the windows per sequence."""

    def queries(self, x: Tensor, fill: float | int | bool = 0) -> Tensor:
        """B x T x ... -> the queries of every window, B x K x Lq x ..."""

    def keys(self, x: Tensor, fill: float | int | bool = 0) -> Tensor:
        """B x T x ... -> the keys of every window, B x K x Lk x ..."""

    def merge(self, windows: Tensor) -> Tensor:
        """B x K x Lq x C outputs of every window's queries -> B x T x C."""

    def mask(self, positions: Tensor, valid: Tensor, causal: bool, ids: Tensor | None = None) -> Tensor:
        """B x K x Lq x Lk, True = attend; positions: B x T original positions of the tokens, valid: B x T, False at
        pads, ids: B x T group ids (schemes that attend within groups only)."""


@dataclass(frozen=True)
class WindowScheme:
    """The language model's schemes; ``size`` and ``stride`` come from a checked ``LayerSettings``."""

    size: int
    stride: int
    length: int
    band: bool = False

    @property
    def count(self) -> int:
        if self.band and is_compiling():
            # compiled with a symbolic T (``--compile-layers``), always one pad slot or more: with none when T is a
            # multiple of the stride, those T and the others would each need a graph; the extra slots are pads
            return self.length // self.stride + 1
        return num_windows(self.length, self.stride)

    @property
    def padded(self) -> int:
        """Length of the padded sequence the query windows tile."""
        return self.count * self.stride if self.band else padded_length(self.length, self.size, self.stride)

    def queries(self, x: Tensor, fill: float | int | bool = 0) -> Tensor:
        """B x T x ... -> B x K x Lq x ..."""
        padded = pad_to(x, self.padded, fill)  # B x Tp x ...
        if self.band:
            return padded.reshape(x.size(0), self.count, self.stride, *x.shape[2:])  # B x K x m x ...
        return unfold_windows(padded, self.size, self.stride)  # B x K x l x ...

    def keys(self, x: Tensor, fill: float | int | bool = 0) -> Tensor:
        """B x T x ... -> B x K x Lk x ..."""
        if self.band:
            return band_key_windows(pad_to(x, self.padded, fill), self.size, self.stride, fill)  # B x K x (l-1+m) x ...
        return self.queries(x, fill)

    def merge(self, windows: Tensor) -> Tensor:
        """B x K x Lq x C -> B x T x C: overlap mean, or the band's blocks laid end to end."""
        if self.band:
            return windows.reshape(windows.size(0), -1, windows.size(-1))[:, : self.length]  # B x T x C
        return merge_windows(windows, self.length, self.size, self.stride)

    def slot_positions(self, positions: Tensor) -> Tensor:
        """Extend B x T positions over the padded slots with unique values >= T (never equal to a real one)."""
        # no tensor of the T..Tp-1 slots alone: compiled with a symbolic T, its size could be zero, and a graph that
        # allows a zero size is not the one for the others (two graphs instead of one)
        slots = torch.arange(self.padded, device=positions.device).expand(positions.size(0), -1)  # B x Tp
        return torch.where(slots < self.length, pad_to(positions, self.padded), slots)  # B x Tp

    def mask(
        self,
        positions: Tensor,
        valid: Tensor,
        causal: bool,
        ids: Tensor | None = None,
    ) -> Tensor:
        """Boolean attention mask B x K x Lq x Lk (True = attend).

        positions: B x T original positions of the (sorted) tokens; valid: B x T, False at pads;
        ids: B x T cluster ids, required by the band scheme (it only links tokens of one cluster).
        """
        slots = self.slot_positions(positions)  # B x Tp
        k_valid = self.keys(valid, False)  # B x K x Lk
        if not self.band:
            q_pos = self.queries(slots)  # B x K x l
            return window_mask(q_pos, q_pos, k_valid, causal)
        if ids is None:
            raise ValueError("the band scheme needs cluster ids")
        ranks = torch.arange(self.padded, device=positions.device).expand(positions.size(0), -1)  # B x Tp
        q_rank = self.queries(ranks)  # B x K x m
        k_rank = self.keys(ranks, -1)  # B x K x (l-1+m); the front slots are never inside a band
        q_ids = self.queries(ids, -1)  # B x K x m
        k_ids = self.keys(ids, -2)  # B x K x (l-1+m); -2 matches no query's id
        return band_mask(q_rank, k_rank, q_ids, k_ids, k_valid, self.size)
