"""A user's own question and document, tokenised as a binarised evaluation split is, with the character span of every
context token in the text the user gave (for the hub and ``fairseq-clusterformer-qa-ask``).

Q = question tokens, N = context tokens.

The document is cut into paragraphs at blank lines (a line break, a line of nothing but whitespace, another line
break): each paragraph, its outer whitespace left out, is one paragraph of a QA record, so the context is
``<p> paragraph <p> paragraph ...`` exactly as ``RecordEncoder`` writes it for an evaluation split (no cut at any
answer edge). Every token keeps the characters of the user's text it covers: a byte-level token inside a
multi-byte character covers that whole character (as ``binarized.span_text`` grows a span to whole characters), and
a token of a tokeniser that is not lossless covers the characters it reports. A predicted span is then the user's
text from its first token's first character to its last token's end, outer whitespace left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from fairseq_clusterformer.qa.data.answer_spans import ParagraphTokenizer
from fairseq_clusterformer.qa.data.records import RecordError

# a paragraph break: a line break, any whitespace-only lines, and the whitespace that opens the next line
PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")


@dataclass
class UserContext:
    ids: np.ndarray  # N dictionary ids, a paragraph token before every paragraph
    chars: np.ndarray  # N x 2 [start, end) characters of the user's text; -1 -1 for a paragraph token


def paragraph_ranges(text: str) -> list[tuple[int, int]]:
    """[start, end) of every paragraph of ``text`` that holds more than whitespace, outer whitespace left out."""
    ranges = []
    start = 0
    for found in [*PARAGRAPH_BREAK.finditer(text), None]:
        stop = found.start() if found is not None else len(text)
        piece = text[start:stop]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            ranges.append((start + lead, start + lead + len(piece.strip())))
        if found is not None:
            start = found.end()
    return ranges


def encode_question(tokenizer, question: str, max_tokens: int) -> np.ndarray:
    """Q dictionary ids of ``question`` (outer whitespace left out, as the binariser does); ValueError if it is
    empty, cannot be tokenised or has more than ``max_tokens`` tokens (the model's --max-question-tokens)."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"the question is empty (got {question!r})")
    try:
        ids, _ = tokenizer.encode(question.strip())
    except RecordError as e:
        raise ValueError(f"the question cannot be tokenised: {e}") from None
    if len(ids) > max_tokens:
        raise ValueError(f"the question has {len(ids)} tokens, over the model's --max-question-tokens {max_tokens}")
    return np.asarray(ids, dtype=np.int64)


def encode_context(paragraphs: ParagraphTokenizer, paragraph_id: int, text: str) -> UserContext:
    """The context ids and every token's characters in ``text``; ValueError if it holds no paragraph or a paragraph
    cannot be tokenised (the message names the paragraph's first character)."""
    if not isinstance(text, str):
        raise ValueError(f"the context must be a string, got {type(text).__name__}")
    ranges = paragraph_ranges(text)
    if not ranges:
        raise ValueError("the context is empty (it holds nothing but whitespace)")
    ids, chars = [], []
    for start, stop in ranges:
        try:
            tokens = paragraphs.tokenize(text[start:stop])
        except RecordError as e:
            raise ValueError(f"the context's paragraph at character {start} cannot be tokenised: {e}") from None
        c2b = tokens.char_to_byte  # L + 1
        # the character holding a token's first byte, and the first character boundary at or after its end
        first = np.searchsorted(c2b, tokens.starts, side="right") - 1  # n
        end = np.searchsorted(c2b, tokens.ends, side="left")  # n
        ids += [np.array([paragraph_id], dtype=np.int64), np.asarray(tokens.ids, dtype=np.int64)]
        chars += [np.array([[-1, -1]], dtype=np.int64), np.stack([first, end], axis=1) + start]  # n x 2
    return UserContext(np.concatenate(ids), np.concatenate(chars))


def span_chars(text: str, chars: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """[start, end) characters of ``text`` that the inclusive token span ``[start, end]`` holds (N x 2 ``chars`` of
    ``encode_context``), outer whitespace left out; (0, 0) if the span holds no text."""
    rows = chars[max(start, 0) : end + 1]  # n x 2
    rows = rows[rows[:, 0] >= 0]  # paragraph tokens hold no text
    if len(rows) == 0:
        return 0, 0
    first, stop = int(rows[:, 0].min()), int(rows[:, 1].max())
    piece = text[first:stop]
    lead = len(piece) - len(piece.lstrip())
    body = len(piece.strip())
    return (first + lead, first + lead + body) if body else (0, 0)
