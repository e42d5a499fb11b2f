"""Exact mapping of character spans to token spans.

N = tokens of one paragraph, L = characters of it.

A subword token need not start or end where an answer does ("1990" inside " 1990s"). In a training split, rather
than round a span to the nearest tokens (which silently changes the answer), the paragraph is tokenised so that every
answer edge is a token edge: the one word that straddles an edge is re-encoded as two pieces. A start edge that falls
just after a token's leading whitespace (" Paris" for "Paris") needs no cut; decoding that token gives the answer plus
a space. An evaluation split must not be cut: the cut would depend on the gold answer and so mark it in the input.
There a gold span maps to the tokens that cover it (``char_span_covering_tokens``), " 49" for the answer "4".

A tokeniser that is not lossless (``HFTokenizer``: uncased WordPiece drops whitespace and accents) gives every token
its character span instead of a byte count, so tokens need not cover the text end to end. It is never cut: a gold
span maps to the tokens that cover it in every split, as BERT's own SQuAD fine-tuning does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from fairseq_clusterformer.qa.data.records import RecordError


@dataclass
class TokenizedText:
    ids: np.ndarray  # N dictionary ids
    starts: np.ndarray  # N byte offset of each token's first byte
    ends: np.ndarray  # N byte offset just after each token's last byte
    char_to_byte: np.ndarray  # L + 1: byte offset of every character, and the total


def char_to_byte_offsets(text: str) -> np.ndarray:
    """Byte offset of every character of ``text`` in its UTF-8 encoding, plus the length in bytes at the end."""
    if text.isascii():
        return np.arange(len(text) + 1, dtype=np.int64)
    code = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # L code points
    width = 1 + (code >= 0x80) + (code >= 0x800) + (code >= 0x10000)  # L UTF-8 lengths
    return np.concatenate([[0], np.cumsum(width, dtype=np.int64)])


def is_lossless(tokenizer) -> bool:
    """Whether ``tokenizer.encode`` gives byte lengths that cover the text end to end (a tokeniser that does not say
    is taken to: GPT-2 BPE and sentencepiece are, and so are the tests' hand-made ones)."""
    return getattr(tokenizer, "lossless", True)


class ParagraphTokenizer:
    """Tokenises paragraphs (with a cache: one SQuAD article serves hundreds of questions) and forces token edges."""

    def __init__(self, tokenizer, cache_size: int = 4096) -> None:
        self.tokenizer = tokenizer
        self.lossless = is_lossless(tokenizer)
        self.cache_size = cache_size
        self._cache: OrderedDict[str, TokenizedText] = OrderedDict()

    def _encode(self, text: str) -> TokenizedText:
        c2b = char_to_byte_offsets(text)
        if not self.lossless:
            ids, offsets = self.tokenizer.encode(text)  # N, N x 2 character spans
            return TokenizedText(ids, c2b[offsets[:, 0]], c2b[offsets[:, 1]], c2b)
        ids, lengths = self.tokenizer.encode(text)
        ends = np.cumsum(lengths, dtype=np.int64)
        return TokenizedText(ids, ends - lengths, ends, c2b)

    def tokenize(self, text: str, spans: list[tuple[int, int]] = ()) -> TokenizedText:
        """Tokens of ``text`` such that every character span ``[start, end)`` in ``spans`` is a run of whole tokens."""
        tokens = self._cache.get(text)
        if tokens is None:
            tokens = self._encode(text)
            self._cache[text] = tokens
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(text)
        if not self.lossless:
            return tokens  # re-encoding a piece of a word would not give the tokens the source model knows
        # right to left, so that a cut never moves the tokens of an edge still to be handled
        edges = {(end, False) for _, end in spans} | {(start, True) for start, _ in spans}
        for edge, is_start in sorted(edges, reverse=True):
            tokens = self._cut(text, tokens, edge, is_start)
        return tokens

    def _cut(self, text: str, tokens: TokenizedText, edge: int, is_start: bool) -> TokenizedText:
        c2b = tokens.char_to_byte
        byte = int(c2b[edge])
        i = int(np.searchsorted(tokens.starts, byte, side="right")) - 1
        if i < 0 or tokens.starts[i] == byte or byte >= tokens.ends[-1]:
            return tokens
        if is_start and _after_leading_space(text, tokens, i, edge):
            return tokens
        # Re-encode the smallest run of tokens around the edge that starts and ends on character boundaries (a
        # byte-level token may hold half of a multi-byte character).
        j = i
        while i > 0 and c2b[np.searchsorted(c2b, tokens.starts[i])] != tokens.starts[i]:
            i -= 1
        while c2b[np.searchsorted(c2b, tokens.ends[j])] != tokens.ends[j]:
            j += 1
        first = int(np.searchsorted(c2b, tokens.starts[i]))
        last = int(np.searchsorted(c2b, tokens.ends[j]))
        left, right = self._encode(text[first:edge]), self._encode(text[edge:last])
        offset = int(c2b[first])
        return TokenizedText(
            np.concatenate([tokens.ids[:i], left.ids, right.ids, tokens.ids[j + 1 :]]),
            np.concatenate([tokens.starts[:i], left.starts + offset, right.starts + byte, tokens.starts[j + 1 :]]),
            np.concatenate([tokens.ends[:i], left.ends + offset, right.ends + byte, tokens.ends[j + 1 :]]),
            c2b,
        )


def _after_leading_space(text: str, tokens: TokenizedText, i: int, start: int) -> bool:
    """Whether character ``start`` comes right after the leading whitespace of token ``i`` (" Paris")."""
    c2b = tokens.char_to_byte
    first = int(np.searchsorted(c2b, tokens.starts[i]))
    return c2b[first] == tokens.starts[i] and first < start and text[first:start].isspace()


def char_span_covering_tokens(text: str, tokens: TokenizedText, start: int, end: int) -> tuple[int, int]:
    """Smallest token span ``[first, last]`` (inclusive) whose bytes hold every token byte of characters
    ``[start, end)``: from the first token that ends after the span's start to the last one that starts before its
    end (for tokens that cover the text end to end, the token holding its first byte and the one holding its last)."""
    c2b = tokens.char_to_byte
    begin, stop = int(c2b[start]), int(c2b[end])
    if not 0 <= begin < stop <= int(c2b[-1]):
        raise RecordError("span_not_aligned", f"characters [{start}, {end}) are not a non-empty span of the text")
    first = int(np.searchsorted(tokens.ends, begin, side="right"))
    last = int(np.searchsorted(tokens.starts, stop, side="left")) - 1
    if last < first:
        raise RecordError("span_not_aligned", f"characters [{start}, {end}) hold no token (only what it drops)")
    return first, last


def token_char_offsets(tokens: TokenizedText) -> np.ndarray:
    """N x 2: every token's ``[start, end)`` in characters of its text (a byte-level token inside one multi-byte
    character gets that character's start)."""
    c2b = tokens.char_to_byte
    return np.stack([np.searchsorted(c2b, tokens.starts), np.searchsorted(c2b, tokens.ends)], axis=1)  # N x 2


def char_span_to_tokens(text: str, tokens: TokenizedText, start: int, end: int) -> tuple[int, int]:
    """Token span ``[first, last]`` (inclusive) covering exactly characters ``[start, end)``, leading spaces aside.

    Raises ``RecordError`` if the edges are not token edges (call ``tokenize`` with the span's edges first).
    """
    c2b = tokens.char_to_byte
    begin, stop = int(c2b[start]), int(c2b[end])
    first, last = char_span_covering_tokens(text, tokens, start, end)
    if not (tokens.starts[first] == begin or _after_leading_space(text, tokens, first, start)):
        raise RecordError("span_not_aligned", f"characters [{start}, {end}) do not start on a token edge")
    if tokens.ends[last] != stop:
        raise RecordError("span_not_aligned", f"characters [{start}, {end}) do not end on a token edge")
    return first, last
