"""QA tokenisers and spans: the exact char -> token span mapping (GPT-2 BPE and sentencepiece, a property test),
evaluation tokens that do not depend on the answer, and span texts of whole characters."""

import io
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_clusterformer.qa.data.answer_spans import ParagraphTokenizer, char_span_to_tokens
from fairseq_clusterformer.qa.data.binarized import span_text, whole_characters
from fairseq_clusterformer.qa.data.encode import RecordEncoder
from fairseq_clusterformer.qa.data.records import SkipLog
from tests.test_qa_binarize import SCORES, TRICKY, gpt2, scores_record, spm_model, spm_tokenizer  # noqa: F401 (fixtures)


def test_gpt2_tokens_are_fairseqs(gpt2):  # noqa: F811
    ids, lengths = gpt2.encode("Hello world")
    # fairseq's RoBERTa encodes "Hello world" as <s> 31414 232 </s>
    assert ids.tolist() == [31414, 232] and lengths.tolist() == [5, 6]
    assert gpt2.decode(ids) == "Hello world"
    for text in TRICKY:
        ids, lengths = gpt2.encode(text)
        assert lengths.sum() == len(text.encode()) and gpt2.decode(ids) == text


ALPHABET = st.sampled_from(list("ab Z1.'\n") + ["é", "東", "🙂", "  ", "ing", " the"])


def check_span_property(tokenizer, data):
    text = "".join(data.draw(st.lists(ALPHABET, min_size=1, max_size=25)))
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    start, end = (
        start + len(text[start:end]) - len(text[start:end].lstrip()),
        end - (len(text[start:end]) - len(text[start:end].rstrip())),
    )
    if start >= end:
        return
    tokens = ParagraphTokenizer(tokenizer).tokenize(text, [(start, end)])
    assert tokenizer.decode(tokens.ids) == text  # cutting at the span's edges loses nothing
    first, last = char_span_to_tokens(text, tokens, start, end)
    decoded = tokenizer.decode(tokens.ids[first : last + 1])
    # exactly the span, possibly behind the leading whitespace its first token carries
    assert decoded.endswith(text[start:end]) and not decoded[: len(decoded) - (end - start)].strip()


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_char_span_maps_to_tokens_that_decode_to_it_gpt2(gpt2, data):  # noqa: F811
    check_span_property(gpt2, data)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_every_char_span_maps_to_tokens_that_decode_to_it_sentencepiece(spm_model, data):  # noqa: F811
    check_span_property(spm_tokenizer(spm_model[0]), data)


class GPT2LikeTokenizer:
    """Lossless toy tokeniser that keeps a leading space with its word, as GPT-2 does: " 49" is one token."""

    PATTERN = re.compile(r" ?\w+| ?[^\s\w]+|\s+(?!\S)|\s+")

    def __init__(self):
        self.vocab = {}

    def encode(self, text):
        pieces = self.PATTERN.findall(text)
        assert "".join(pieces) == text
        ids = [self.vocab.setdefault(p, 10 + len(self.vocab)) for p in pieces]
        return np.array(ids, dtype=np.int64), np.array([len(p.encode()) for p in pieces], dtype=np.int64)


@pytest.mark.parametrize("name", ["toy", "gpt2"])
def test_evaluation_tokens_do_not_depend_on_the_answer(request, name):
    tokenizer = GPT2LikeTokenizer() if name == "toy" else request.getfixturevalue("gpt2")
    encoder = RecordEncoder(tokenizer, paragraph_id=4)
    log = SkipLog(stream=io.StringIO())
    four = scores_record("a", "4", SCORES.index(" 49 ") + 1)  # ends inside the token " 49"
    phobos = scores_record("b", "Phobos", SCORES.index("Phobos"))
    natural = tokenizer.encode(SCORES)[0].tolist()
    assert len(tokenizer.encode(" 49")[0]) == 1
    evaluation = [encoder.encode(r, "here", log) for r in (four, phobos)]
    # the same tokens whatever the answer: the paragraph's own tokens behind its paragraph token
    assert evaluation[0].context.tolist() == evaluation[1].context.tolist() == [4, *natural]
    # the gold "4" maps to the token " 49" that covers it
    first, last = evaluation[0].meta["spans"][0]
    assert first == last and natural[first - 1] == tokenizer.encode(" 49")[0].tolist()[0]
    training = [encoder.encode(r, "here", log, cut_at_answers=True) for r in (four, phobos)]
    assert training[1].context.tolist() == [4, *natural]  # " Phobos" already starts on a token edge
    cut = training[0].context.tolist()
    assert cut != [4, *natural] and len(cut) == len(natural) + 2  # " 49" became " 4" + "9"
    first, last = training[0].meta["spans"][0]
    assert first == last and cut[first] == tokenizer.encode(" 4")[0].tolist()[0]
    assert not log.skipped and not log.lost


def test_span_text_gives_whole_characters_of_the_context(gpt2):  # noqa: F811
    text = "Tokyo (東京) is big 🙂🙂 too."
    ids = gpt2.encode(text)[0]
    assert "\ufffd" in gpt2.decode(ids[4:5])  # byte-level BPE splits "東" across tokens
    pieces = [span_text(gpt2, ids, i, i) for i in range(len(ids))]
    assert all("\ufffd" not in p and p in text for p in pieces)
    assert pieces[3:7] == ["東", "東", "京", "京"] and pieces[11:13] == ["🙂", "🙂"]


def test_whole_characters():
    emoji = "🙂".encode()
    assert whole_characters(b"a" + emoji[:1], emoji[1:3], emoji[3:] + b"b") == emoji
    assert whole_characters(b"", b"ab", b"c") == b"ab"
    assert whole_characters(emoji[:2], emoji[2:], b"") == emoji
    assert whole_characters(b"x", emoji[:1], emoji[1:] + b"y") == emoji
