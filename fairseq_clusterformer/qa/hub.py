"""The QA model's hub interface: ask a trained clusterformer_qa checkpoint about your own text.

    qa = ClusterFormerQAModel.from_pretrained("checkpoints/squad", "checkpoint_best.pt", data_name_or_path="bin")
    best = qa.answer("Who wrote Hamlet?", open("play.txt").read())[0]
    best.text, best.start, best.end, best.score     # context[best.start:best.end] == best.text

Q = question tokens, N = context tokens, B = questions of a batch, k = answers per question.

A question and its context go the way a binarised evaluation split goes through ``fairseq-clusterformer-qa-predict``:
the same tokeniser and paragraphs (``qa/data/user_text.py``), the same checks and cut of a context over
--max-context-eval (``qa/data/dataset.py``), the same forward and span decoder (``ClusterFormerQATask
.decode_answers``), so the hub's best answer is the one qa-predict writes. A longer context is refused unless the
caller chose to truncate it; an answer then says where the model stopped reading (``truncated_at``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from fairseq.data import data_utils
from torch import nn

from fairseq_clusterformer.qa.data.answer_spans import ParagraphTokenizer
from fairseq_clusterformer.qa.data.dataset import QAItem, QALimits, check_example, cut_context
from fairseq_clusterformer.qa.data.records import ANSWER_TYPES
from fairseq_clusterformer.qa.data.user_text import encode_context, encode_question, span_chars
from fairseq_clusterformer.qa.ops.spans import paragraph_ids, span_positions, top_spans

logger = logging.getLogger(__name__)

# what to do with a context over the model's --max-context-eval, and the dataset's name for it
OVERFLOW = {"refuse": "skip", "truncate": "truncate"}


@dataclass(frozen=True)
class Answer:
    text: str
    start: int  # first character of the answer in the context given
    end: int  # just after its last character: context[start:end] == text
    score: float  # start logit + end logit of its span, as qa-predict ranks spans
    answer_type: str | None = None  # Natural Questions models: the answer-type head's class (one of ANSWER_TYPES)
    truncated_at: int | None = None  # the context was cut: the model read its characters before this one only

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class EncodedQuestion:
    """One question and context, tokenised and checked, as the model reads them."""

    question: torch.Tensor  # Q ids, no <s> / </s>
    context: torch.Tensor  # N ids, cut to the limit when it was truncated
    chars: np.ndarray  # N x 2 characters of ``text`` of every context token (-1 -1: a paragraph token)
    text: str  # the context as the user gave it
    truncated_at: int | None


class ClusterFormerQAHubInterface(nn.Module):
    """``answer`` one question, ``answer_batch`` many; built by ``ClusterFormerQAModel.from_pretrained``."""

    def __init__(self, cfg, task, model, tokenizer) -> None:
        super().__init__()
        self.cfg, self.task, self.model, self.tokenizer = cfg, task, model, tokenizer
        self.paragraphs = ParagraphTokenizer(tokenizer)
        # follows .cuda() / .to() with the model, as fairseq's hub interfaces do
        self.register_buffer("_float_tensor", torch.tensor([0], dtype=torch.float), persistent=False)

    @property
    def device(self) -> torch.device:
        return self._float_tensor.device

    @property
    def max_context_tokens(self) -> int:
        """The longest context the model reads, in tokens (the task's --max-context-eval)."""
        return int(self.task.cfg.max_context_eval)

    def encode(self, question: str, context: str, overflow: str = "refuse") -> EncodedQuestion:
        """Tokenise and check one question; ValueError naming what is wrong (an empty question or context, a
        question over --max-question-tokens, a context over --max-context-eval with ``overflow="refuse"``)."""
        if overflow not in OVERFLOW:
            raise ValueError(f"overflow {overflow!r}: expected one of {', '.join(OVERFLOW)}")
        ids = encode_question(self.tokenizer, question, self.task.max_question_tokens)
        user = encode_context(self.paragraphs, self.task.paragraph, context)
        limits = QALimits(self.task.max_question_tokens, self.max_context_tokens, OVERFLOW[overflow], training=False)
        starts = np.flatnonzero(user.ids == self.task.paragraph).tolist()
        meta = {"spans": [], "paragraph_starts": starts, "long_answer": -1}
        cut, reason = check_example(len(ids), user.ids, meta, self.task.paragraph, limits)
        if reason == "context_too_long":
            raise ValueError(
                f"the context has {len(user.ids)} tokens, over the model's --max-context-eval "
                f"{self.max_context_tokens}: truncate it to its first tokens (overflow='truncate', "
                "--context-overflow truncate) or allow longer contexts (max_context_eval, --max-context-eval)"
            )
        if reason is not None:
            raise ValueError(f"the context cannot be read ({reason}): it holds no token the model can answer with")
        item = QAItem(0, cut.length, [], -1, -1, cut if cut.length < len(user.ids) else None)
        chars = cut_context(torch.from_numpy(user.chars), item).numpy()  # N' x 2
        truncated_at = None
        if item.cut is not None:
            truncated_at = int(chars[:, 1].max())
            logger.info(f"the context has {len(user.ids)} tokens: the model reads the first {cut.length}")
        return EncodedQuestion(
            torch.from_numpy(ids), cut_context(torch.from_numpy(user.ids), item), chars, context, truncated_at
        )

    def answer(
        self, question: str, context: str, top_k: int = 1, overflow: str = "refuse", overlapping: bool = False
    ) -> list[Answer]:
        """The ``top_k`` best answers to ``question`` in ``context``, best first; spans that share no token unless
        ``overlapping`` (then the ``top_k`` best spans, which crowd around the best answer)."""
        return self.answer_encoded([self.encode(question, context, overflow)], top_k, overlapping=overlapping)[0]

    def answer_batch(
        self,
        items: Iterable[tuple[str, str]],
        top_k: int = 1,
        overflow: str = "refuse",
        batch_size: int = 8,
        overlapping: bool = False,
    ) -> list[list[Answer]]:
        """The answers of every (question, context) pair (or {"question", "context"} object), in order;
        ValueError naming the first bad item."""
        encoded = []
        for n, item in enumerate(items):
            question, context = (item.get("question"), item.get("context")) if isinstance(item, dict) else item
            try:
                encoded.append(self.encode(question, context, overflow))
            except ValueError as e:
                raise ValueError(f"item {n}: {e}") from None
        return self.answer_encoded(encoded, top_k, batch_size, overlapping)

    @torch.no_grad()
    def answer_encoded(
        self, encoded: Sequence[EncodedQuestion], top_k: int = 1, batch_size: int = 8, overlapping: bool = False
    ) -> list[list[Answer]]:
        """Answers of encoded questions, in order; batches of ``batch_size`` questions of similar length."""
        if top_k < 1 or batch_size < 1:
            raise ValueError(f"top_k and batch_size must be at least 1, got {top_k} and {batch_size}")
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].context))
        answers: list[list[Answer]] = [[] for _ in encoded]
        for first in range(0, len(order), batch_size):
            rows = order[first : first + batch_size]
            for row, found in zip(rows, self._answer_batch([encoded[i] for i in rows], top_k, overlapping)):
                answers[row] = found
        return answers

    def _answer_batch(self, batch: list[EncodedQuestion], top_k: int, overlapping: bool) -> list[list[Answer]]:
        pad = self.task.dictionary.pad()
        question = data_utils.collate_tokens([e.question for e in batch], pad).to(self.device)  # B x Q
        context = data_utils.collate_tokens([e.context for e in batch], pad).to(self.device)  # B x N
        logits = self.model(question=question, context=context)
        best = self.task.decode_answers(logits, context)  # what validation and qa-predict decode
        if top_k == 1:
            spans = [[(p.start, p.end, p.span_score)] for p in best]
        else:
            valid = span_positions(context, pad, self.task.paragraph)  # B x N
            segments = paragraph_ids(context, self.task.paragraph)  # B x N
            longest = self.task.cfg.max_answer_tokens
            ranked = top_spans(logits["start"], logits["end"], valid, longest, top_k, segments, overlapping)
            spans = [list(zip(*(x.tolist() for x in row))) for row in zip(*ranked)]
        return [
            [self._answer(e, start, end, score, p.answer_type) for start, end, score in row if score > float("-inf")]
            for e, row, p in zip(batch, spans, best)
        ]

    def _answer(self, encoded: EncodedQuestion, start: int, end: int, score: float, kind: int | None) -> Answer:
        first, stop = span_chars(encoded.text, encoded.chars, start, end)
        return Answer(
            text=encoded.text[first:stop],
            start=first,
            end=stop,
            score=float(score),
            answer_type=ANSWER_TYPES[kind] if kind is not None else None,
            truncated_at=encoded.truncated_at,
        )
