"""The clusterformer_qa task's dataset: one binarised split, filtered, batched for the QA model.

B = batch, q = question tokens, T = context tokens, G = gold spans per example.

Every example is checked once, when the split is loaded, never mid-epoch: an example the model cannot take
(a question over --max-question-tokens, a context over the maximum, an empty context) or whose gold data does
not fit its context (a span outside it or on a paragraph token, a long answer that is not a paragraph) is left
out, counted by reason, and logged. In training, examples with nothing to learn from are left out as well
(span data sets: no gold span in the context).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils

from fairseq_clusterformer.data.qa_binarized import QABinarizedSplit
from fairseq_clusterformer.data.qa_records import ANSWER_TYPES

logger = logging.getLogger(__name__)

CONTEXT_OVERFLOW = ("skip", "truncate")


@dataclass(frozen=True)
class QALimits:
    max_question_tokens: int
    max_context_tokens: int
    context_overflow: str = "skip"  # or "truncate": keep the first max_context_tokens tokens
    training: bool = False


@dataclass
class QAItem:
    index: int  # the example's index in the split
    context_len: int
    spans: list[tuple[int, int]]
    answer_type: int  # index into ANSWER_TYPES, -1 when the data set has none
    long_answer: int  # paragraph index, -1 if none


def check_example(
    question_len: int, context: np.ndarray, meta: dict[str, Any], paragraph_id: int, limits: QALimits
) -> tuple[int, str | None]:
    """(context length to use, reason to leave the example out or None)."""
    length = len(context)
    if length == 0 or not np.any(context != paragraph_id):
        return length, "empty_context"
    if question_len > limits.max_question_tokens:
        return length, "question_too_long"
    if length > limits.max_context_tokens:
        if limits.context_overflow == "skip":
            return length, "context_too_long"
        length = limits.max_context_tokens
    starts = meta.get("paragraph_starts", [])
    if any(not 0 <= s < len(context) or context[s] != paragraph_id for s in starts):
        return length, "bad_paragraph_starts"
    for start, end in meta.get("spans", []):
        if not 0 <= start <= end < len(context) or np.any(context[start : end + 1] == paragraph_id):
            return length, "bad_span"
    long_answer = meta.get("long_answer", -1)
    if long_answer >= len(starts):
        return length, "bad_long_answer"
    answer_type = meta.get("answer_type")
    if answer_type is not None and answer_type not in ANSWER_TYPES:
        return length, "bad_answer_type"
    if limits.training:
        kept = [s for s in meta.get("spans", []) if s[1] < length]
        if answer_type in (None, "short") and not kept:
            return length, "no_gold_span_in_context"
        if answer_type in ("long", "short") and not (long_answer >= 0 and starts[long_answer] < length):
            return length, "no_long_answer_in_context"
    return length, None


class QADataset(FairseqDataset):
    def __init__(self, split: QABinarizedSplit, limits: QALimits, pad: int, shuffle: bool = False, seed: int = 1):
        self.split, self.limits, self.pad = split, limits, pad
        self.shuffle, self.seed = shuffle, seed
        self.skipped: Counter[str] = Counter()
        self.items: list[QAItem] = []
        question_sizes = split.question_sizes
        for i in range(len(split)):
            meta = split.metas[i]
            context = np.asarray(split.contexts[i])
            length, reason = check_example(int(question_sizes[i]), context, meta, split.paragraph_id, limits)
            if reason is not None:
                self.skipped[reason] += 1
                continue
            spans = [(s, e) for s, e in meta.get("spans", []) if e < length]
            answer_type = meta.get("answer_type")
            long_answer = meta.get("long_answer", -1)
            if long_answer >= 0 and meta["paragraph_starts"][long_answer] >= length:
                long_answer = -1
            kind = ANSWER_TYPES.index(answer_type) if answer_type is not None else -1
            self.items.append(QAItem(i, length, spans, kind, long_answer))
        self.sizes = np.array([question_sizes[it.index] + it.context_len for it in self.items], dtype=np.int64)

    def report(self) -> str:
        total = len(self.items) + sum(self.skipped.values())
        reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(self.skipped.items())) or "none"
        return (
            f"{self.split.data_dir}/{self.split.split}: {len(self.items)} of {total} examples kept; skipped: {reasons} "
            f"(--max-question-tokens {self.limits.max_question_tokens}, max context {self.limits.max_context_tokens} "
            f"tokens, --context-overflow {self.limits.context_overflow})"
        )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.items[index]
        example = self.split[item.index]
        return {"id": index, "item": item, "question": example.question, "context": example.context[: item.context_len]}

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
            "meta": [self.split.metas[it.index] for it in items],
        }
