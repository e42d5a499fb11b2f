"""The clusterformer_qa task's dataset: one binarised split, filtered, batched for the QA model.

B = batch, q = question tokens, T = context tokens, G = gold spans per example.

Every example is checked once, when the split is loaded, never mid-epoch: an example the model cannot take
(a question over --max-question-tokens, an empty context, a context over the maximum under --context-overflow
skip) or whose gold data does not fit its context (a span outside it or on a paragraph token, a long answer that
is not a paragraph) is left out, counted by reason, and logged. A context over the maximum under --context-overflow
truncate is cut (qa_truncation.py): in the training split whole paragraphs, gold ones first; in the others its
first tokens; the cuts and the gold answers they lose are counted. In training, examples with nothing to learn
from are left out as well (span data sets: no gold span in the context).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils

from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit
from fairseq_clusterformer.qa.data.records import ANSWER_TYPES
from fairseq_clusterformer.qa.data.truncation import ContextCut, apply_cut, keep_first, keep_gold_paragraphs

logger = logging.getLogger(__name__)

CONTEXT_OVERFLOW = ("skip", "truncate")


@dataclass(frozen=True)
class QALimits:
    max_question_tokens: int
    max_context_tokens: int
    # "truncate": cut a longer context (qa_truncation.py: answer-aware in training, the first tokens otherwise);
    # "skip": leave the example out
    context_overflow: str = "truncate"
    training: bool = False


@dataclass
class QAItem:
    index: int  # the example's index in the split
    context_len: int
    spans: list[tuple[int, int]]
    answer_type: int  # index into ANSWER_TYPES, -1 when the data set has none
    long_answer: int  # paragraph index, -1 if none
    cut: ContextCut | None = None  # how a context over the limit was cut; None: the whole context


def answer_type_of(meta: dict[str, Any]) -> str | None:
    """The example's answer type (one of ANSWER_TYPES, None for span-only data). Data binarised before the yes/no
    classes wrote a yes/no answer as "long" and kept the answer in ``extra.yes_no_answer``: it is read as yes / no,
    so that such data trains and scores the yes/no classes without binarising it again."""
    answer_type = meta.get("answer_type")
    yes_no = str((meta.get("extra") or {}).get("yes_no_answer", "NONE")).lower()
    if answer_type == "long" and yes_no in ("yes", "no"):
        return yes_no
    return answer_type


def check_example(
    question_len: int, context: np.ndarray, meta: dict[str, Any], paragraph_id: int, limits: QALimits
) -> tuple[ContextCut, str | None]:
    """(the context as the model will read it, reason to leave the example out or None)."""
    length = len(context)
    spans = meta.get("spans", [])
    starts = meta.get("paragraph_starts", [])
    long_answer = meta.get("long_answer", -1)
    whole = ContextCut(((0, length),), [tuple(s) for s in spans], long_answer, list(starts), 0, False)
    if length == 0 or not np.any(context != paragraph_id):
        return whole, "empty_context"
    if question_len > limits.max_question_tokens:
        return whole, "question_too_long"
    if length > limits.max_context_tokens and limits.context_overflow == "skip":
        return whole, "context_too_long"
    if any(not 0 <= s < len(context) or context[s] != paragraph_id for s in starts):
        return whole, "bad_paragraph_starts"
    for start, end in spans:
        if not 0 <= start <= end < len(context) or np.any(context[start : end + 1] == paragraph_id):
            return whole, "bad_span"
    if long_answer >= len(starts):
        return whole, "bad_long_answer"
    answer_type = answer_type_of(meta)
    if answer_type is not None and answer_type not in ANSWER_TYPES:
        return whole, "bad_answer_type"
    cut = whole
    if length > limits.max_context_tokens:
        limit = limits.max_context_tokens
        if limits.training:
            long_start = starts[long_answer] if long_answer >= 0 else -1
            pieces = keep_gold_paragraphs(context, paragraph_id, limit, spans, long_start)
        else:
            pieces = keep_first(length, limit)
        cut = apply_cut(pieces, spans, long_answer, starts)
    if limits.training:
        if answer_type in (None, "short") and not cut.spans:
            return cut, "no_gold_span_in_context"
        if answer_type not in (None, "none") and cut.long_answer < 0:
            return cut, "no_long_answer_in_context"
    return cut, None


class QADataset(FairseqDataset):
    def __init__(self, split: QABinarizedSplit, limits: QALimits, pad: int, shuffle: bool = False, seed: int = 1):
        self.split, self.limits, self.pad = split, limits, pad
        self.shuffle, self.seed = shuffle, seed
        self.skipped: Counter[str] = Counter()
        self.truncated = 0  # kept examples whose context was cut
        self.lost: Counter[str] = Counter()  # gold spans / long answers of kept examples that the cuts left out
        self.gold_spans = 0  # gold spans of the kept examples, before the cuts
        self.items: list[QAItem] = []
        question_sizes = split.question_sizes
        for i in range(len(split)):
            meta = split.metas[i]
            context = np.asarray(split.contexts[i])
            cut, reason = check_example(int(question_sizes[i]), context, meta, split.paragraph_id, limits)
            if reason is not None:
                self.skipped[reason] += 1
                continue
            answer_type = answer_type_of(meta)
            kind = ANSWER_TYPES.index(answer_type) if answer_type is not None else -1
            truncated = cut.length < len(context)
            self.truncated += truncated
            self.gold_spans += len(meta.get("spans", []))
            self.lost["spans"] += cut.spans_lost
            self.lost["long_answers"] += cut.long_answer_lost
            self.items.append(QAItem(i, cut.length, cut.spans, kind, cut.long_answer, cut if truncated else None))
        self.sizes = np.array([question_sizes[it.index] + it.context_len for it in self.items], dtype=np.int64)
        self._position = {it.index: n for n, it in enumerate(self.items)}

    def report(self) -> str:
        """One line for the training log: examples kept, cut and left out (by reason), gold answers cut away."""
        total = len(self.items) + sum(self.skipped.values())
        reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(self.skipped.items())) or "none"
        how = "gold paragraphs first" if self.limits.training else "first tokens"
        if self.limits.context_overflow == "skip":
            how = "longer contexts are skipped"
        long_answers = f", {self.lost['long_answers']} long answers" if self.lost["long_answers"] else ""
        return (
            f"{self.split.data_dir}/{self.split.split}: {len(self.items)} of {total} examples kept, {self.truncated} "
            f"of them truncated ({how}); skipped: {reasons}; lost to truncation: {self.lost['spans']} of "
            f"{self.gold_spans} gold spans{long_answers} (--max-question-tokens {self.limits.max_question_tokens}, "
            f"max context {self.limits.max_context_tokens} tokens, --context-overflow {self.limits.context_overflow})"
        )

    @property
    def moves_positions(self) -> bool:
        """True when a cut moved paragraphs (a training split over the limit), so token offsets into the original
        context no longer hold for those examples."""
        return any(item.cut is not None and not item.cut.is_prefix for item in self.items)

    def model_context(self, example_index: int) -> torch.Tensor:
        """The context of example ``example_index`` of the split as the model reads it (N tokens, cut if it was)."""
        return cut_context(self.split[example_index].context, self.items[self._position[example_index]])

    def model_offsets(self, example_index: int) -> torch.Tensor:
        """The N x 3 context token offsets of example ``example_index`` as the model reads its context (a tokeniser
        that is not lossless only; cut the way ``model_context`` is)."""
        return cut_context(self.split.context_offsets(example_index), self.items[self._position[example_index]])

    def _meta(self, item: QAItem) -> dict[str, Any]:
        """The example's meta line, its spans and paragraphs re-indexed when its context was cut into pieces (in a
        training split; a cut that keeps the first tokens leaves every position where it was)."""
        meta = self.split.metas[item.index]
        if item.cut is None or item.cut.is_prefix:
            return meta
        return {
            **meta,
            "spans": [list(s) for s in item.spans],
            "long_answer": item.long_answer,
            "paragraph_starts": item.cut.paragraph_starts,
        }

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.items[index]
        example = self.split[item.index]
        return {"id": index, "item": item, "question": example.question, "context": cut_context(example.context, item)}

    def num_tokens(self, index: int) -> int:
        return int(self.sizes[index])

    def size(self, index: int) -> int:
        return int(self.sizes[index])

    def ordered_indices(self) -> np.ndarray:
        """Longest examples last, so that a batch holds examples of similar length (random order among equals)."""
        if self.shuffle:
            with data_utils.numpy_seed(self.seed, len(self)):
                order = np.random.permutation(len(self))
        else:
            order = np.arange(len(self))
        return order[np.argsort(self.sizes[order], kind="mergesort")]

    @property
    def supports_prefetch(self) -> bool:
        return False

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        """fairseq's batching, always with a batch-size multiple of 1: fairseq-fixed 0.12.3.1's batcher drops the
        last examples when --required-batch-size-multiple (default 8) does not divide their number, which would
        leave validation questions unscored. Checked: every index is in exactly one batch."""
        batches = super().batch_by_size(indices, max_tokens, max_sentences, 1)
        if sum(len(b) for b in batches) != len(indices):
            raise RuntimeError(f"fairseq's batcher lost {len(indices) - sum(len(b) for b in batches)} examples")
        return batches

    def collater(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        if not samples:
            return {}
        items = [s["item"] for s in samples]
        question = data_utils.collate_tokens([s["question"] for s in samples], self.pad)  # B x q
        context = data_utils.collate_tokens([s["context"] for s in samples], self.pad)  # B x T
        most = max(1, max(len(it.spans) for it in items))
        spans = torch.full((len(items), most, 2), -1, dtype=torch.long)  # B x G x 2
        for row, it in enumerate(items):
            if it.spans:
                spans[row, : len(it.spans)] = torch.tensor(it.spans, dtype=torch.long)
        return {
            "id": torch.tensor([s["id"] for s in samples], dtype=torch.long),
            "split": self.split.split,
            "example_index": [it.index for it in items],
            "nsentences": len(samples),
            "ntokens": int(question.ne(self.pad).sum() + context.ne(self.pad).sum()),
            "net_input": {"question": question, "context": context},
            "spans": spans,
            "answer_type": torch.tensor([it.answer_type for it in items], dtype=torch.long),
            "long_answer": torch.tensor([it.long_answer for it in items], dtype=torch.long),
            "meta": [self._meta(it) for it in items],
        }


def cut_context(context: torch.Tensor, item: QAItem) -> torch.Tensor:
    """The item's context as the model reads it: the whole N-token context, or its kept pieces joined (``context``
    may be any tensor with one row per context token, such as its offsets)."""
    if item.cut is None:
        return context
    return torch.cat([context[start:stop] for start, stop in item.cut.pieces])  # N' <= limit
