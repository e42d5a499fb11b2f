"""Turn one QA record into token ids and the meta line of the binarised format.

Q = question tokens, N = context tokens.

The context is every paragraph behind a paragraph token: ``<p> tokens-of-paragraph-0 <p> tokens-of-paragraph-1 ...``.
Gold character spans become inclusive token spans into that context: exact ones in a training split (cut at the
answer's edges, ``cut_at_answers``), the covering tokens of the natural tokenisation in an evaluation split, whose
tokens must not depend on the gold answers. A context over the token limit keeps what fits;
spans and the long answer that fall beyond it are dropped and counted, and the example says whether its gold answer
is still in the context (``gold_in_context``), so that training can leave out the ones it could never predict.
A tokeniser that is not lossless (``HFTokenizer``) is never cut, and the example also carries every context token's
paragraph and character span (``offsets``), from which a predicted span's text is cut out of the paragraphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fairseq_clusterformer.qa.data.answer_spans import (
    ParagraphTokenizer,
    char_span_covering_tokens,
    char_span_to_tokens,
    token_char_offsets,
)
from fairseq_clusterformer.qa.data.records import QARecord, RecordError, SkipLog, skipped_example

# one default for the binariser and the task: a larger binariser limit kept questions that training then skipped
MAX_QUESTION_TOKENS = 64


@dataclass
class EncodedExample:
    question: np.ndarray  # Q dictionary ids, no <s> / </s>
    context: np.ndarray  # N dictionary ids, a paragraph token before every paragraph
    meta: dict[str, Any]
    # tokenisers that are not lossless only: N x 3 (paragraph, first character, end character; -1 -1 for a paragraph
    # token) and the paragraphs those characters index
    offsets: np.ndarray | None = None
    paragraphs: list[str] | None = None


class RecordEncoder:
    def __init__(
        self,
        tokenizer,
        paragraph_id: int,
        max_context_tokens: int = 10000,
        max_question_tokens: int = MAX_QUESTION_TOKENS,
    ) -> None:
        if max_context_tokens < 2:
            raise ValueError(f"--max-context-tokens must be at least 2, got {max_context_tokens}")
        if max_question_tokens < 1:
            raise ValueError(f"--max-question-tokens must be at least 1, got {max_question_tokens}")
        self.tokenizer = tokenizer
        self.paragraphs = ParagraphTokenizer(tokenizer)
        self.paragraph_id = paragraph_id
        self.max_context = max_context_tokens
        self.max_question = max_question_tokens

    def encode(self, record: QARecord, where: str, log: SkipLog, cut_at_answers: bool = False) -> EncodedExample | None:
        """The example, or None (logged under its reason) if the record cannot be used at all.

        ``cut_at_answers`` (training splits only) makes every gold answer edge a token edge, so that the gold spans
        are exactly the answers; otherwise the context is tokenised as it would be without any answer.
        """
        try:
            return self._encode(record, where, log, cut_at_answers)
        except RecordError as e:
            log.skip(where, e.reason, str(e), skipped_example(record.id, e.reason, record.extra))
            return None

    def _encode(self, record: QARecord, where: str, log: SkipLog, cut_at_answers: bool) -> EncodedExample:
        question, _ = self.tokenizer.encode(record.question.strip())
        if len(question) > self.max_question:
            raise RecordError(
                "question_too_long",
                f"the question has {len(question)} tokens, over --max-question-tokens {self.max_question}",
            )
        lossless = self.paragraphs.lossless
        exact = cut_at_answers and lossless
        pieces, starts, spans, offsets = [], [], set(), []
        length = 0
        for p, text in enumerate(record.paragraphs):
            wanted = [(s, e) for q, s, e in record.spans if q == p]
            tokens = self.paragraphs.tokenize(text, wanted if exact else [])
            starts.append(length)
            to_tokens = char_span_to_tokens if exact else char_span_covering_tokens
            for s, e in wanted:
                first, last = to_tokens(text, tokens, s, e)
                spans.add((length + 1 + first, length + 1 + last))  # +1: the paragraph token
            pieces.append(np.array([self.paragraph_id], dtype=np.int64))
            pieces.append(tokens.ids)
            if not lossless:
                chars = token_char_offsets(tokens)  # n x 2
                offsets.append(np.array([[p, -1, -1]], dtype=np.int64))
                offsets.append(np.concatenate([np.full((len(chars), 1), p, dtype=np.int64), chars], axis=1))  # n x 3
            length += 1 + len(tokens.ids)
        context = np.concatenate(pieces)  # N
        context_offsets = None if lossless else np.concatenate(offsets)[: self.max_context]  # N x 3

        kept_spans = sorted(s for s in spans if s[1] < self.max_context)
        kept_starts = [s for s in starts if s < self.max_context]
        long_answer = record.long_answer if record.long_answer < len(kept_starts) else -1
        if length > self.max_context:
            context = context[: self.max_context]
            if len(kept_spans) < len(spans):
                log.lose(
                    where,
                    "context_too_long",
                    f"{len(spans) - len(kept_spans)} of {len(spans)} answer span(s) lie "
                    f"beyond the first {self.max_context} of {length} context tokens (--max-context-tokens)",
                )
            if long_answer != record.long_answer:
                log.lose(
                    where,
                    "long_answer_beyond_limit",
                    f"the long answer (paragraph {record.long_answer}) lies "
                    f"beyond --max-context-tokens {self.max_context}",
                )
        gold_in_context = (not record.answers or bool(kept_spans)) and long_answer == record.long_answer
        meta = {
            "id": record.id,
            "question": record.question,
            "answers": record.answers,
            "spans": [list(s) for s in kept_spans],
            "answer_type": record.answer_type,
            "long_answer": long_answer,
            "paragraph_starts": kept_starts,
            "gold_in_context": gold_in_context,
            "extra": record.extra,
        }
        return EncodedExample(question, context, meta, context_offsets, None if lossless else record.paragraphs)
