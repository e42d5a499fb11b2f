"""Cutting a QA context that is longer than the task's limit (``--context-overflow truncate``).

N = context tokens. A context is ``<p> paragraph <p> paragraph ...``; a cut is a list of pieces, half-open ranges
of the original context kept in document order, and the gold spans and the long answer are re-indexed to the
positions the pieces give them.

- ``keep_first``: the first ``limit`` tokens. It never looks at the answers, so it is the only cut for validation
  and test splits (an answer-dependent cut would tell the model where the answer is).
- ``keep_gold_paragraphs``: for training splits, the paper's cut at 5,000 tokens without losing the supervision:
  whole paragraphs, those that hold a gold span (or the long answer) first, then every other paragraph that still
  fits, in document order. A gold paragraph that alone is longer than the limit keeps its ``<p>`` and a window
  around its first gold span.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Piece = tuple[int, int]  # half-open range [start, stop) of original context positions


@dataclass(frozen=True)
class ContextCut:
    pieces: tuple[Piece, ...]  # in document order, non-overlapping
    spans: list[tuple[int, int]]  # the gold spans that survive the cut, in the cut context's positions
    long_answer: int  # the long answer's paragraph index in the cut context, -1 if none or cut away
    paragraph_starts: list[int]  # positions of the kept paragraph tokens in the cut context
    spans_lost: int
    long_answer_lost: bool

    @property
    def length(self) -> int:
        return sum(stop - start for start, stop in self.pieces)

    @property
    def is_prefix(self) -> bool:
        """Whether the cut context is a prefix of the original one (positions unchanged)."""
        return len(self.pieces) == 1 and self.pieces[0][0] == 0


def apply_cut(
    pieces: Sequence[Piece], spans: Sequence[Sequence[int]], long_answer: int, paragraph_starts: Sequence[int]
) -> ContextCut:
    """Re-index the inclusive gold ``spans`` and the long answer (an index into ``paragraph_starts``) to ``pieces``."""
    pieces = merge_adjacent(sorted(pieces))
    firsts = np.array([start for start, _ in pieces], dtype=np.int64)
    offsets = np.cumsum([0] + [stop - start for start, stop in pieces])

    def new_position(old: int) -> int | None:
        j = int(np.searchsorted(firsts, old, side="right")) - 1
        if j < 0 or old >= pieces[j][1]:
            return None
        return int(offsets[j] + old - pieces[j][0])

    kept_spans = []
    for start, end in spans:
        first, last = new_position(start), new_position(end)
        # positions only grow, so the span is still contiguous exactly when its width is unchanged
        if first is not None and last is not None and last - first == end - start:
            kept_spans.append((first, last))
    new_starts = [new_position(s) for s in paragraph_starts]
    kept_starts = [s for s in new_starts if s is not None]
    new_long = -1
    if long_answer >= 0 and new_starts[long_answer] is not None:
        new_long = sum(s is not None for s in new_starts[:long_answer])
    return ContextCut(
        pieces=tuple(pieces),
        spans=kept_spans,
        long_answer=new_long,
        paragraph_starts=kept_starts,
        spans_lost=len(spans) - len(kept_spans),
        long_answer_lost=long_answer >= 0 and new_long < 0,
    )


def merge_adjacent(pieces: Sequence[Piece]) -> list[Piece]:
    merged: list[Piece] = []
    for start, stop in pieces:
        if stop <= start:
            continue
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


def keep_first(length: int, limit: int) -> list[Piece]:
    """The first ``limit`` of ``length`` tokens: the cut for validation and test splits, blind to the answers."""
    return [(0, min(length, limit))]


def paragraph_blocks(context: np.ndarray, paragraph_id: int) -> list[Piece]:
    """Each paragraph as a range from its ``<p>`` to the next (text before the first ``<p>`` is a block of its own)."""
    bounds = sorted({0, *np.flatnonzero(context == paragraph_id).tolist()})
    return list(zip(bounds, bounds[1:] + [len(context)]))


def keep_gold_paragraphs(
    context: np.ndarray,
    paragraph_id: int,
    limit: int,
    spans: Sequence[Sequence[int]],
    long_answer_start: int = -1,
) -> list[Piece]:
    """At most ``limit`` tokens of the N-token ``context`` in whole paragraphs: the gold ones first (those holding a
    span start, and the one starting at ``long_answer_start``), then the others in document order while they fit.
    A training-split cut only: it reads the answers."""
    blocks = paragraph_blocks(context, paragraph_id)
    firsts = [start for start, _ in blocks]

    def block_of(position: int) -> int:
        return int(np.searchsorted(firsts, position, side="right")) - 1

    gold = sorted(
        {block_of(start) for start, _ in spans} | ({block_of(long_answer_start)} if long_answer_start >= 0 else set())
    )
    budget, chosen = limit, []
    for k in gold:
        start, stop = blocks[k]
        if stop - start <= budget:
            chosen.append(blocks[k])
            budget -= stop - start
    if gold and not chosen:  # every gold paragraph is longer than the limit: cut the first around its first span
        k = gold[0]
        in_block = [tuple(s) for s in spans if block_of(s[0]) == k]
        chosen = window_around(context, paragraph_id, blocks[k], in_block[0] if in_block else None, limit)
        budget = 0
    for k, (start, stop) in enumerate(blocks):
        if k not in gold and stop - start <= budget:
            chosen.append((start, stop))
            budget -= stop - start
    return merge_adjacent(sorted(chosen))


def window_around(
    context: np.ndarray, paragraph_id: int, block: Piece, span: tuple[int, int] | None, limit: int
) -> list[Piece]:
    """``limit`` tokens of one paragraph: its ``<p>`` and the window of the others that centres ``span`` (the
    paragraph's first tokens without a span)."""
    start, stop = block
    head = 1 if context[start] == paragraph_id else 0
    width = max(limit - head, 0)
    first = start + head
    if span is not None:
        slack = width - (span[1] - span[0] + 1)
        first = span[0] - max(slack, 0) // 2
    first = max(start + head, min(first, stop - width))
    return [(start, start + head), (first, first + width)]
