"""Question + context windows of the QA encoder (paper eq. 1-3), as index arithmetic on one flat layout.

B = batch, K = windows, Q = question block (<s> question </s></s>, padded), T = context tokens, C = channels,
l = window size (context tokens per window), m = stride, W = Q + l (tokens per window), S = K * (Q + m).

Between layers a QA example is one flat sequence, the paper's eq. 3:
    [question copy 0; context[0 : m]; question copy 1; context[m : 2m]; ...]      (B x S)
Every window keeps its own copy of the question states, and every context token appears once. Window k is
    [question copy k; context[k*m : k*m + l]]                                      (B x K x W)
gathered from the flat sequence by index; after a layer, question copies go back to their own slots and context
tokens get the mean over the windows that contain them (eq. 2). A long-range layer runs on the flat sequence
as it is. Context positions past the last chunk (only ever pads) map to one extra sentinel slot S.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fairseq_clusterformer.ops.masks import window_mask
from fairseq_clusterformer.ops.windows import num_windows, pad_to


@dataclass(frozen=True)
class QALayout:
    question_len: int  # Q, the padded question block including <s> and </s>
    context_len: int  # T, the padded context length of the batch
    size: int  # l
    stride: int  # m

    def __post_init__(self) -> None:
        # size and stride come from a checked LayerSettings; the lengths come from the batch
        if self.question_len < 1 or self.context_len < 1:
            raise ValueError(f"empty question block ({self.question_len}) or context ({self.context_len})")

    @property
    def count(self) -> int:
        """K: a window starts at every multiple of the stride below T."""
        return num_windows(self.context_len, self.stride)

    @property
    def chunk(self) -> int:
        return self.question_len + self.stride

    @property
    def flat_len(self) -> int:
        return self.count * self.chunk

    @property
    def window_len(self) -> int:
        return self.question_len + self.size

    def context_slots(self, device: torch.device | None = None) -> Tensor:
        """Flat slot of every context position 0..T-1 (a length-T LongTensor)."""
        c = torch.arange(self.context_len, device=device)
        return (c // self.stride) * self.chunk + self.question_len + c % self.stride

    def window_slots(self, device: torch.device | None = None) -> Tensor:
        """Flat slot of every window position, K x W; context past the last chunk -> sentinel S."""
        k = torch.arange(self.count, device=device)[:, None]  # K x 1
        question = k * self.chunk + torch.arange(self.question_len, device=device)[None, :]  # K x Q
        c = k * self.stride + torch.arange(self.size, device=device)[None, :]  # K x l context positions
        context = (c // self.stride) * self.chunk + self.question_len + c % self.stride  # K x l
        context = torch.where(c < self.count * self.stride, context, torch.full_like(context, self.flat_len))
        return torch.cat([question, context], dim=1)  # K x W

    def coverage(self, device: torch.device | None, dtype: torch.dtype) -> Tensor:
        """How many windows hold each flat slot (length S, all >= 1).

        Counted by adding ones at every window's slots into a fixed S + 1 (the sentinel last): ``bincount`` would
        read the largest slot back from the device to size its output, a host sync in every QA layer."""
        slots = self.window_slots(device).reshape(-1)  # K*W
        counts = torch.zeros(self.flat_len + 1, dtype=torch.long, device=device)  # S+1
        counts.index_add_(0, slots, torch.ones_like(slots))  # integer sums: the same in any order
        return counts[: self.flat_len].to(dtype)


def to_flat(question: Tensor, context: Tensor, layout: QALayout, fill: float | int | bool = 0) -> Tensor:
    """Question copies B x K x Q x ... and context B x T x ... -> the flat eq.-3 sequence B x S x ..."""
    bsz, k = question.size(0), layout.count
    chunks = pad_to(context, k * layout.stride, fill).reshape(bsz, k, layout.stride, *context.shape[2:])  # B x K x m
    return torch.cat([question, chunks], dim=2).reshape(bsz, layout.flat_len, *context.shape[2:])  # B x S x ...


def from_flat(flat: Tensor, layout: QALayout) -> tuple[Tensor, Tensor]:
    """Inverse of ``to_flat``: B x S x ... -> (question copies B x K x Q x ..., context B x T x ...)."""
    bsz, k, q = flat.size(0), layout.count, layout.question_len
    chunks = flat.reshape(bsz, k, layout.chunk, *flat.shape[2:])  # B x K x (Q+m) x ...
    context = chunks[:, :, q:].reshape(bsz, k * layout.stride, *flat.shape[2:])  # B x K*m x ...
    return chunks[:, :, :q], context[:, : layout.context_len]


def gather_windows(flat: Tensor, layout: QALayout, fill: float | int | bool = 0) -> Tensor:
    """B x S x ... -> the windows B x K x W x ... (slots past the context get ``fill``)."""
    sentinel = flat.new_full((flat.size(0), 1, *flat.shape[2:]), fill)
    extended = torch.cat([flat, sentinel], dim=1)  # B x (S+1) x ...
    slots = layout.window_slots(flat.device)  # K x W
    picked = extended.index_select(1, slots.reshape(-1))  # B x K*W x ...
    return picked.reshape(flat.size(0), layout.count, layout.window_len, *flat.shape[2:])  # B x K x W x ...


def merge_windows(windows: Tensor, layout: QALayout) -> Tensor:
    """B x K x W x C -> B x S x C: question copies return to their slots, context slots get the window mean."""
    bsz, channels = windows.size(0), windows.size(-1)
    total = windows.new_zeros(bsz, layout.flat_len + 1, channels)
    slots = layout.window_slots(windows.device).reshape(-1)  # K*W
    total.index_add_(1, slots, windows.reshape(bsz, -1, channels))  # B x (S+1) x C
    return total[:, : layout.flat_len] / layout.coverage(windows.device, windows.dtype)[None, :, None]


# fairseq RoBERTa's sentence-pair input, the one the pretrained model saw: <s> question </s></s> context </s>
QUESTION_SPECIALS = 3  # <s> before the question, </s></s> after it


def question_block(question: Tensor, bos: int, eos: int, pad: int) -> Tensor:
    """B x q question ids (right-padded with ``pad``, no <s>/</s>) -> B x (q+3) blocks ``<s> question </s></s>``
    then pads."""
    bsz, q = question.shape
    lengths = question.ne(pad).sum(dim=1)  # B
    block = question.new_full((bsz, q + QUESTION_SPECIALS), pad)
    block[:, 0] = bos
    block[:, 1 : q + 1] = question
    block.scatter_(1, torch.stack([lengths + 1, lengths + 2], dim=1), eos)
    return block


def close_context(context: Tensor, eos: int, pad: int) -> Tensor:
    """B x T right-padded context ids -> B x (T+1) with ``</s>`` right after every row's last token."""
    lengths = context.ne(pad).sum(dim=1)  # B
    closed = torch.cat([context, context.new_full((context.size(0), 1), pad)], dim=1)  # B x (T+1)
    return closed.scatter_(1, lengths[:, None], eos)


def qa_tokens(
    question: Tensor, context: Tensor, layout: QALayout, bos: int, eos: int, pad: int
) -> tuple[Tensor, Tensor]:
    """Token ids in the flat layout (B x S) and of every window (B x K x W): ``<s> question </s></s> [pads]
    context[k*m : k*m + l]`` (the encoder passes a context that ends in ``</s>``, see ``close_context``).

    question: B x q and context: B x T, both right-padded with ``pad``. The question copy of a window
    that holds none of its example's context (a short context in a batch of long ones) is all pad, so
    that no example's result depends on the others in its batch.
    """
    block = question_block(question, bos, eos, pad)  # B x Q
    lengths = context.ne(pad).sum(dim=1)  # B
    own_windows = torch.clamp((lengths + layout.stride - 1) // layout.stride, min=1)  # B
    k = torch.arange(layout.count, device=context.device)  # K
    copies = block[:, None, :].expand(-1, layout.count, -1)  # B x K x Q
    copies = copies.masked_fill((k[None, :] >= own_windows[:, None])[:, :, None], pad)  # B x K x Q
    flat = to_flat(copies, context, layout, pad)  # B x S
    return flat, gather_windows(flat, layout, pad)


class QAInputWindows:
    """The window scheme of the first layer, whose input is already cut into windows (each window's
    embeddings carry its own positions, so they cannot come from one flat sequence): B x (K*W) x C in,
    the flat layout out. A ``ops.window_scheme.Windowing``, as the language model's schemes are."""

    def __init__(self, layout: QALayout) -> None:
        self.layout = layout
        self.count = layout.count

    def queries(self, x: Tensor, fill: float | int | bool = 0) -> Tensor:
        return x.reshape(x.size(0), self.count, self.layout.window_len, *x.shape[2:])  # B x K x W x ...

    keys = queries

    def merge(self, windows: Tensor) -> Tensor:
        return merge_windows(windows, self.layout)

    def mask(self, positions: Tensor, valid: Tensor, causal: bool, ids: Tensor | None = None) -> Tensor:
        """B x K x W x W, True = attend: every window is one bidirectional sequence; pads are never keys."""
        slots = torch.arange(self.layout.window_len, device=valid.device).expand(valid.size(0), self.count, -1)
        return window_mask(slots, slots, self.keys(valid), causal)


class QAWindows(QAInputWindows):
    """The window scheme of every later sliding-window layer: flat B x S x C in and out."""

    def queries(self, x: Tensor, fill: float | int | bool = 0) -> Tensor:
        return gather_windows(x, self.layout, fill)

    keys = queries

    def mask(self, positions: Tensor, valid: Tensor, causal: bool, ids: Tensor | None = None) -> Tensor:
        slots = self.layout.window_slots(valid.device).expand(valid.size(0), -1, -1)  # B x K x W
        return window_mask(slots, slots, self.keys(valid, False), causal)
