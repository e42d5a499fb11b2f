"""A user's own text for the QA hub (qa/data/user_text.py): paragraphs cut at blank lines whatever the whitespace,
context ids equal to the binariser's, and every token span's characters giving exactly the text qa-predict prints
(sentencepiece with byte pieces inside non-ASCII characters, and the HF tokenizer that is not lossless); the
tokeniser files found beside the data when the recorded paths are another machine's."""

import json
import shutil

import numpy as np
import pytest
from fairseq.data import Dictionary
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_clusterformer.qa.data.answer_spans import ParagraphTokenizer, token_char_offsets
from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit, span_text
from fairseq_clusterformer.qa.data.context_text import span_text_from_offsets
from fairseq_clusterformer.qa.data.encode import RecordEncoder
from fairseq_clusterformer.qa.data.hf_tokenizer import HFTokenizer, hf_dictionary
from fairseq_clusterformer.qa.data.records import QARecord, SkipLog
from fairseq_clusterformer.qa.data.tokenizers import add_paragraph_token, locate_tokenizer_files
from fairseq_clusterformer.qa.data.user_text import encode_context, paragraph_ranges, span_chars
from tests.data.qa_model.synthetic import shared_data
from tests.test_hf_tokenizer import make_hf_dir

# odd whitespace and characters a byte-level vocabulary of 300 pieces holds only as UTF-8 bytes
TEXTS = [
    "the secret word is café .  naïve\tcolour of 日本 is amber 🙂 .",
    "  Ünïcödé\u00a0spaces\u2003and ﬁ ligatures — “quoted” words ,\r\nsecond line of it",
    "x",
]
SEPARATORS = ["\n\n", "\r\n\r\n", "\n \t\n\n   ", "\n\u3000\n"]

paragraph = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30).filter(
    lambda t: t.strip() and "\n" not in t
)


@given(st.lists(paragraph, min_size=1, max_size=5), st.sampled_from(SEPARATORS), st.sampled_from(["", " \n", "\n\n"]))
@settings(max_examples=200, deadline=None)
def test_paragraphs_are_the_texts_between_blank_lines(paragraphs, separator, edge):
    text = edge + separator.join(paragraphs) + edge
    ranges = paragraph_ranges(text)
    assert [text[s:e] for s, e in ranges] == [p.strip() for p in paragraphs]


@pytest.fixture(scope="module")
def spm_split(tmp_path_factory):
    return QABinarizedSplit(str(shared_data(tmp_path_factory)), "valid")


def every_span(chars, length=4):
    """Inclusive token spans of up to ``length`` tokens that hold no paragraph token."""
    text_rows = np.flatnonzero(chars[:, 0] >= 0)
    for i in text_rows:
        for j in range(i, min(i + length, len(chars))):
            if chars[j, 0] < 0:
                break
            yield int(i), int(j)


def test_context_ids_are_the_binarisers_and_every_span_slices_to_qa_predicts_text(spm_split):
    """Sentencepiece (lossless, byte pieces for the characters it has no piece for): the ids equal RecordEncoder's
    for the same paragraphs, and every span's characters of the user's text are span_text's answer."""
    tokenizer = spm_split.tokenizer
    encoder = RecordEncoder(tokenizer, spm_split.paragraph_id)
    text = "\n\n\t ".join(TEXTS)
    user = encode_context(ParagraphTokenizer(tokenizer), spm_split.paragraph_id, text)
    record = QARecord("x", "q", [text[s:e] for s, e in paragraph_ranges(text)])
    assert user.ids.tolist() == encoder.encode(record, "x", SkipLog()).context.tolist()
    # byte pieces, several of them inside one character: a token's characters are that whole character
    sp_ids = [int(i) for i in tokenizer.from_dict[user.ids] if i >= 0]
    assert sum(tokenizer.sp.is_byte(i) for i in sp_ids) > 10
    assert any((user.chars[i] == user.chars[i + 1]).all() for i in range(len(user.chars) - 1) if user.chars[i, 0] >= 0)
    spans = list(every_span(user.chars))
    assert len(spans) > 200
    for start, end in spans:
        first, stop = span_chars(text, user.chars, start, end)
        assert text[first:stop] == span_text(tokenizer, user.ids, start, end), (start, end)


def test_hf_tokenizer_spans_slice_to_the_original_characters(tmp_path_factory):
    """The uncased WordPiece tokenizer (lower-cases, strips accents, drops spaces): every span's characters are those
    the binarised path cuts out of the paragraphs (span_text_from_offsets), case and accents kept."""
    hf_dir = make_hf_dir(tmp_path_factory.mktemp("user_text_hf"))
    dictionary = hf_dictionary(str(hf_dir))
    p = add_paragraph_token(dictionary)
    tokenizer = HFTokenizer(str(hf_dir), dictionary)
    text = "\r\n\r\n".join(TEXTS + ["Sky UK Limited is a British broadcaster, in Isleworth."])
    user = encode_context(ParagraphTokenizer(tokenizer), p, text)
    paragraphs = [text[s:e] for s, e in paragraph_ranges(text)]
    offsets = []
    for n, piece in enumerate(paragraphs):
        chars = token_char_offsets(ParagraphTokenizer(tokenizer).tokenize(piece))  # n x 2
        offsets += [[n, -1, -1], *([n, s, e] for s, e in chars)]
    offsets = np.array(offsets)  # N x 3
    cased = 0
    for start, end in every_span(user.chars):
        first, stop = span_chars(text, user.chars, start, end)
        assert text[first:stop] == span_text_from_offsets(paragraphs, offsets, start, end)
        cased += text[first:stop] != text[first:stop].lower()
    assert cased > 0


def test_tokenizer_files_are_found_beside_the_data_when_the_recorded_path_is_gone(spm_split, tmp_path):
    model = spm_split.tokenizer.model_path
    config = {"tokenizer": "sentencepiece", "sentencepiece_model": "/elsewhere/trainer/spm/qa.model"}
    data, ckpt = tmp_path / "data", tmp_path / "ckpt"
    data.mkdir(), ckpt.mkdir()
    with pytest.raises(FileNotFoundError) as error:
        locate_tokenizer_files(config, [str(data), str(ckpt)])
    message = str(error.value)
    assert "sentencepiece_model as '/elsewhere/trainer/spm/qa.model'" in message
    assert str(data / "qa_config.json") in message and str(ckpt / "qa.model") in message
    assert str(tmp_path / "spm" / "qa.model") in message  # the folder of the recorded name beside the data
    shutil.copy(model, ckpt / "qa.model")
    assert locate_tokenizer_files(config, [str(data), str(ckpt)])["sentencepiece_model"] == str(ckpt / "qa.model")
    shutil.copy(model, data / "qa.model")
    assert locate_tokenizer_files(config, [str(data), str(ckpt)])["sentencepiece_model"] == str(data / "qa.model")
    recorded = {**config, "sentencepiece_model": model}  # a recorded path that is there is used as it is
    assert locate_tokenizer_files(recorded, [str(data)])["sentencepiece_model"] == model


def test_an_hf_import_is_found_in_the_data_folder_itself(tmp_path_factory):
    hf_dir = make_hf_dir(tmp_path_factory.mktemp("user_text_hf_dir"))
    data = hf_dir.parent / "data"
    shutil.copytree(hf_dir, data)
    config = {"tokenizer": "hf", "hf_dir": "/elsewhere/imports/bert"}
    assert locate_tokenizer_files(config, [str(data)])["hf_dir"] == str(data)
    assert json.loads((data / "hf_import.json").read_text())["special_tokens"]
    assert isinstance(HFTokenizer(str(data), Dictionary.load(str(data / "dict.txt"))), HFTokenizer)
