"""The QA binariser: exact char -> token span mapping (GPT-2 BPE and sentencepiece), the binarised format read back
through fairseq, bad input, and the official prediction writers."""

import contextlib
import gzip
import io
import json
import re
import sys
from unittest import mock

import numpy as np
import pytest
from fairseq.data import Dictionary, data_utils
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_clusterformer.qa.data.answer_spans import ParagraphTokenizer, char_span_to_tokens
from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit, span_in_paragraph, span_text, whole_characters
from fairseq_clusterformer.qa.data.encode import RecordEncoder
from fairseq_clusterformer.qa.data.predictions import nq_prediction, write_nq_predictions, write_squad_predictions
from fairseq_clusterformer.qa.data.records import QARecord, SkipLog
from fairseq_clusterformer.qa.data.tokenizers import GPT2BPETokenizer, SentencePieceTokenizer, add_paragraph_token
from fairseq_clusterformer.qa.ops.metrics import nq_label_from_json, nq_scores, squad_scores
from fairseq_clusterformer.qa.scripts import binarize as qa_binarize
from fairseq_clusterformer.qa.scripts import convert as qa_convert
from tests.conftest import run_ok
from tests.test_qa_convert import DATA, nq_example

GPT2 = DATA / "gpt2_bpe"
GPT2_FLAGS = [
    "--tokenizer",
    "gpt2",
    "--encoder-json",
    GPT2 / "encoder.json",
    "--vocab-bpe",
    GPT2 / "vocab.bpe",
    "--dict",
    GPT2 / "dict.txt",
]

# text with sub-word answers, multi-byte characters that byte-level BPE splits, newlines and odd spacing
TRICKY = [
    "In the 1990s, Zürich grew.\n\nTokyo (東京) is big 🙂🙂 too.",
    '  Leading spaces, then tabs\tand the U.S.A.\'s "quoted" words; e-mail: a@b.c',
]
# "1990" in " 1990s", "Zürich", "東京", "🙂🙂", the first "🙂", "Leading", "'s \"qu", "\" word", "il: a@b.", "c", ...
TRICKY_SPANS = [
    (0, 7, 11),
    (0, 14, 20),
    (0, 35, 37),
    (0, 46, 48),
    (0, 46, 47),
    (1, 2, 9),
    (1, 42, 48),
    (1, 52, 58),
    (1, 65, 73),
    (1, 73, 74),
    (1, 36, 41),
]


def tricky_record(rid="r0", spans=TRICKY_SPANS, **kw):
    spans = [list(s) for s in spans]
    answers = sorted({TRICKY[p][s:e] for p, s, e in spans})
    return QARecord(id=rid, question="What grew in the 1990s?", paragraphs=TRICKY, answers=answers, spans=spans, **kw)


def run_inprocess(script, *args):
    """A console script's cli_main run in this process (fairseq is imported once): (exit code, its stderr)."""
    err = io.StringIO()
    code = 0
    with mock.patch.object(sys, "argv", [script.__name__, *map(str, args)]), contextlib.redirect_stderr(err):
        try:
            script.cli_main()
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def binarize_ok(*args):
    code, text = run_inprocess(qa_binarize, *args)
    assert code == 0, text[-3000:]
    return text


def convert_ok(*args):
    code, text = run_inprocess(qa_convert, *args)
    assert code == 0, text[-3000:]


def write_jsonl(path, records):
    path.write_text("".join((r.to_json() if isinstance(r, QARecord) else r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def gpt2():
    dictionary = Dictionary.load(str(GPT2 / "dict.txt"))
    add_paragraph_token(dictionary)
    return GPT2BPETokenizer(str(GPT2 / "encoder.json"), str(GPT2 / "vocab.bpe"), dictionary)


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    """A small sentencepiece model trained by our console script on QA records."""
    tmp = tmp_path_factory.mktemp("spm")
    lines = [
        QARecord(
            id=f"r{i}",
            question=f"question number {i} about planets ?",
            paragraphs=[
                f"Mars is the fourth planet {i} ; its moons are Phobos and Deimos . The 1990s were {i} years ago ."
            ],
        )
        for i in range(200)
    ]
    records = write_jsonl(tmp / "records.jsonl", [tricky_record(), *lines])
    run_ok(
        "fairseq-clusterformer-train-spm", "--input", records, "--model-prefix", tmp / "spm" / "qa", "--vocab-size", 400
    )
    return tmp / "spm" / "qa.model", records


def spm_tokenizer(model):
    from fairseq_clusterformer.qa.data.tokenizers import sentencepiece_dictionary

    dictionary = sentencepiece_dictionary(str(model))
    add_paragraph_token(dictionary)
    return SentencePieceTokenizer(str(model), dictionary)


def test_gpt2_tokens_are_fairseqs(gpt2):
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
def test_every_char_span_maps_to_tokens_that_decode_to_it_gpt2(gpt2, data):
    check_span_property(gpt2, data)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_every_char_span_maps_to_tokens_that_decode_to_it_sentencepiece(spm_model, data):
    check_span_property(spm_tokenizer(spm_model[0]), data)


def check_split(data_dir, split, expected):
    """Every gold token span decodes to its answer (training split) or covers it (evaluation split); paragraph tokens
    sit where the meta says."""
    data = QABinarizedSplit(str(data_dir), split)
    assert len(data) == expected
    exact = data.config["splits"][split]["cut_at_answers"]
    assert exact == (split == "train")
    # fairseq itself reads the same ids
    contexts = data_utils.load_indexed_dataset(str(data_dir / f"{split}.context"), data.dictionary, "mmap")
    spans = 0
    for i in range(len(data)):
        example = data[i]
        assert example.context.tolist() == contexts[i].tolist()
        assert example.context.numel() == data.context_sizes[i] <= data.config["max_context_tokens"]
        starts = example.meta["paragraph_starts"]
        assert np.flatnonzero(example.context.numpy() == data.paragraph_id).tolist() == starts
        answers = [a.casefold() for a in example.meta["answers"]]
        for start, end in example.meta["spans"]:
            spans += 1
            text = data.span_text(i, start, end).casefold()
            assert text in answers if exact else any(a in text for a in answers)
    return data, spans


def test_binarize_gpt2_tricky_spans_exact(tmp_path):
    records = write_jsonl(tmp_path / "train.jsonl", [tricky_record(), tricky_record("r1", TRICKY_SPANS[3:5])])
    out = run_ok("fairseq-clusterformer-qa-binarize", *GPT2_FLAGS, "--train", records, "--destdir", tmp_path / "bin")
    assert "kept 2 examples; skipped none" in out
    data, spans = check_split(tmp_path / "bin", "train", 2)
    assert spans == len(TRICKY_SPANS) + 2
    # the answer "1990" of " 1990s" forced a cut: both records share the paragraph text but not its tokens
    assert data.span_text(0, *data[0].meta["spans"][0]) == "1990"
    assert data.dictionary[data.paragraph_id] == "<p>" and data.paragraph_id == len(data.dictionary) - 1
    assert (
        data.question_sizes[0] > 0
        and data[0].question.tolist() == data.tokenizer.encode("What grew in the 1990s?")[0].tolist()
    )


def test_binarize_sentencepiece(tmp_path, spm_model):
    model, records = spm_model
    binarize_ok(
        "--tokenizer",
        "sentencepiece",
        "--sentencepiece-model",
        model,
        "--train",
        records,
        "--destdir",
        tmp_path / "bin",
    )
    data, spans = check_split(tmp_path / "bin", "train", 201)
    assert spans == len(TRICKY_SPANS) and data.config["tokenizer"] == "sentencepiece"
    assert data.span_text(0, *data[0].meta["spans"][-1]) == "c"

    # distant supervision added by the binariser: every whole-word occurrence of "Phobos" / "the", any case
    distant = QARecord(
        id="d", question="q?", paragraphs=["Phobos and phobos; Phobos2 THE theory the"], answers=["phobos", "the"]
    )
    src = write_jsonl(tmp_path / "distant.jsonl", [distant])
    binarize_ok(
        "--tokenizer",
        "sentencepiece",
        "--sentencepiece-model",
        model,
        "--test",
        src,
        "--destdir",
        tmp_path / "bin",
        "--find-all-occurrences",
    )
    data, spans = check_split(tmp_path / "bin", "test", 1)
    assert [data.span_text(0, *s) for s in data[0].meta["spans"]] == ["Phobos", "phobos", "THE", "the"]


def test_bad_input_is_skipped_counted_and_named(tmp_path):
    good = tricky_record("good")
    mismatch = QARecord(id="shifted", question="q?", paragraphs=["abc def"], answers=["def"], spans=[[0, 3, 6]])
    empty = QARecord(id="empty", question="q?", paragraphs=["", "  "], answers=[])
    long_question = QARecord(id="longq", question="why " * 30, paragraphs=["text"], answers=[])
    long_context = QARecord(
        id="far", question="q?", paragraphs=["word " * 60 + "target"], answers=["target"], spans=[[0, 300, 306]]
    )
    lines = [
        good,
        mismatch.to_json(),
        empty,
        "{not json",
        long_question,
        '{"id": "x", "question": "q"}',
        long_context,
        good.to_json()[:50],
    ]
    src = write_jsonl(tmp_path / "bad.jsonl", lines)
    text = binarize_ok(
        *GPT2_FLAGS,
        "--valid",
        src,
        "--destdir",
        tmp_path / "bin",
        "--max-context-tokens",
        "40",
        "--max-question-tokens",
        "12",
    )
    assert f"{src}:2 [shifted]: skipped (offset_mismatch): span [0, 3, 6] covers ' de'" in text
    assert f"{src}:3 [empty]: skipped (empty_context)" in text
    assert f"{src}:4: skipped (malformed): not valid JSON" in text
    assert f"{src}:5 [longq]: skipped (question_too_long): the question has 30 tokens" in text
    assert f"{src}:6 [x]: skipped (malformed): missing field(s) paragraphs" in text
    assert f"{src}:7 [far]: dropped (context_too_long): 1 of 1 answer span(s) lie beyond the first 40" in text
    assert f"{src}:8: skipped (malformed)" in text  # the truncated last line
    config = json.loads((tmp_path / "bin" / "qa_config.json").read_text())["splits"]["valid"]
    assert config["skipped"] == {"empty_context": 1, "malformed": 3, "offset_mismatch": 1, "question_too_long": 1}
    assert config["examples"] == 2 and config["gold_not_in_context"] == 1
    assert config["answers_lost"] == {"context_too_long": 2}  # "good" keeps the spans of its first 40 tokens only
    data = QABinarizedSplit(str(tmp_path / "bin"), "valid")
    assert [m["gold_in_context"] for m in data.metas] == [True, False]
    assert all(e < 40 for m in data.metas for _, e in m["spans"]) and data.metas[0]["spans"]

    # --drop-unreachable (for training) leaves "far" out too
    text = binarize_ok(
        *GPT2_FLAGS,
        "--train",
        src,
        "--destdir",
        tmp_path / "bin",
        "--max-context-tokens",
        "40",
        "--max-question-tokens",
        "12",
        "--drop-unreachable",
    )
    assert f"{src}:7 [far]: skipped (answer_not_in_context)" in text
    assert [m["id"] for m in QABinarizedSplit(str(tmp_path / "bin"), "train").metas] == ["good"]
    # nothing usable: exit 1 and no file of the split, not even a temporary one
    only_bad = write_jsonl(tmp_path / "only_bad.jsonl", lines[1:4] + lines[5:6])
    code, text = run_inprocess(qa_binarize, *GPT2_FLAGS, "--test", only_bad, "--destdir", tmp_path / "bin")
    assert code == 1 and f"error: {only_bad}: no usable example" in text
    assert not list((tmp_path / "bin").glob("test.*")) and not list((tmp_path / "bin").glob(".*tmp*"))
    code, text = run_inprocess(qa_binarize, "--tokenizer", "gpt2", "--valid", src, "--destdir", tmp_path / "b2")
    assert code == 1 and "--tokenizer gpt2 needs --encoder-json" in text


def test_real_squad_v2_sample_binarizes_exactly(tmp_path):
    records = tmp_path / "sq2.jsonl"
    convert_ok(
        "--format",
        "squad",
        DATA / "squad" / "dev-v2.0.first5articles_san_mrc.json",
        records,
    )
    binarize_ok(*GPT2_FLAGS, "--train", records, "--valid", records, "--destdir", tmp_path / "bin")
    check_split(tmp_path / "bin", "valid", 1407)  # natural tokens, gold spans that cover the answers
    data, spans = check_split(tmp_path / "bin", "train", 1407)
    assert spans > 700 and sum(not m["answers"] for m in data.metas) == 702
    assert all(m["gold_in_context"] for m in data.metas)  # five articles all fit in 10,000 tokens
    # gold answers of the training split (cut at their edges) written as predictions score 100 with the SQuAD metric
    answers = {m["id"]: data.span_text(i, *m["spans"][0]) if m["spans"] else "" for i, m in enumerate(data.metas)}
    write_squad_predictions(str(tmp_path / "pred.json"), answers)
    read_back = json.loads((tmp_path / "pred.json").read_text())
    golds = {m["id"]: m["answers"] for m in data.metas}
    assert squad_scores(golds, read_back, version="2.0") == {"exact_match": 100.0, "f1": 100.0}


def test_nq_gold_spans_round_trip_to_official_predictions(tmp_path, gpt2):
    src = tmp_path / "nq.jsonl.gz"
    null = {
        "long_answer": {"start_token": -1, "end_token": -1, "candidate_index": -1},
        "short_answers": [],
        "yes_no_answer": "NONE",
    }
    lines = [nq_example(), nq_example(7, [null])]
    src.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    convert_ok("--format", "nq", src, tmp_path / "nq.jsonl")
    binarize_ok(
        *GPT2_FLAGS,
        "--valid",
        tmp_path / "nq.jsonl",
        "--destdir",
        tmp_path / "bin",
    )
    data, _ = check_split(tmp_path / "bin", "valid", 2)
    predictions = []
    for i, meta in enumerate(data.metas):
        span = tuple(meta["spans"][0]) if meta["spans"] else None
        predictions.append(
            nq_prediction(
                data.tokenizer, data[i].context, meta, meta["answer_type"], meta["long_answer"], 1.0, span, 1.0
            )
        )
    assert predictions[0]["long_answer"]["start_token"] == 10 and predictions[0]["long_answer"]["end_token"] == 24
    assert [(s["start_token"], s["end_token"]) for s in predictions[0]["short_answers"]] == [(19, 22)]
    assert predictions[1]["long_answer"]["start_token"] == -1 and predictions[1]["short_answers"] == []
    write_nq_predictions(str(tmp_path / "nq-pred.json"), predictions)
    read_back = json.loads((tmp_path / "nq-pred.json").read_text())["predictions"]
    golds = {
        str(m["extra"]["example_id"]): [nq_label_from_json(a) for a in m["extra"]["annotations"]] for m in data.metas
    }
    scores = nq_scores(golds, {str(p["example_id"]): nq_label_from_json(p) for p in read_back}, non_null_threshold=1)
    assert scores["long-f1"] == 1.0 and scores["short-f1"] == 1.0
    # a span that straddles two paragraphs is cut at the end of its own
    meta = data.metas[0]
    starts = meta["paragraph_starts"]
    p, byte_start, byte_end = span_in_paragraph(gpt2, data[0].context, starts, starts[0] + 1, starts[1] + 2)
    assert (p, byte_start) == (0, 0) and byte_end == len(lines[0]["document_text"].split("<P> ")[1].split(" </P>")[0])


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


SCORES = "Mars is the fourth planet; in 1949 it had 49 visitors and Phobos."


def scores_record(rid, answer, start):
    assert SCORES[start : start + len(answer)] == answer
    return QARecord(
        id=rid, question="How many?", paragraphs=[SCORES], answers=[answer], spans=[[0, start, start + len(answer)]]
    )


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


def test_binariser_cuts_only_training_splits_and_scores_original_text(tmp_path, spm_model):
    model, _ = spm_model
    tokenizer = spm_tokenizer(model)
    fourth, planet = SCORES.index("fourth"), SCORES.index("planet")
    # "plan" ends inside a sentencepiece token (the model was trained on "the fourth planet")
    assert planet + 4 not in np.cumsum(tokenizer.encode(SCORES)[1]).tolist()
    records = [
        scores_record("plan", "plan", planet),
        scores_record("phobos", "Phobos", SCORES.index("Phobos")),
        scores_record("fourth-plan", "fourth plan", fourth),
    ]
    src = write_jsonl(tmp_path / "records.jsonl", records)
    flags = ["--tokenizer", "sentencepiece", "--sentencepiece-model", model, "--destdir", tmp_path / "bin"]
    binarize_ok(*flags, "--train", src, "--valid", src, "--split", f"test={src}")
    natural = [QABinarizedSplit(str(tmp_path / "bin"), "valid").paragraph_id, *tokenizer.encode(SCORES)[0].tolist()]
    for split in ("valid", "test"):
        data = QABinarizedSplit(str(tmp_path / "bin"), split)
        assert [data[i].context.tolist() for i in range(3)] == [natural] * 3
    train = QABinarizedSplit(str(tmp_path / "bin"), "train")
    assert train[0].context.tolist() != natural and train[1].context.tolist() == natural
    assert train.span_text(0, *train.metas[0]["spans"][0]) == "plan"

    # predictions of the covering gold spans are the context's own characters, scored against the gold answers
    data = QABinarizedSplit(str(tmp_path / "bin"), "valid")
    predicted = {m["id"]: data.span_text(i, *m["spans"][0]) for i, m in enumerate(data.metas)}
    assert predicted == {"plan": "planet", "phobos": "Phobos", "fourth-plan": "fourth planet"}
    # by hand: "planet" shares no word with "plan"; "fourth planet" shares one of two words with "fourth plan"
    by_hand = {"plan": (0.0, 0.0), "phobos": (100.0, 100.0), "fourth-plan": (0.0, 50.0)}
    golds = {m["id"]: m["answers"] for m in data.metas}
    for rid, (em, f1) in by_hand.items():
        scores = squad_scores({rid: golds[rid]}, {rid: predicted[rid]})
        assert scores["exact_match"] == em and scores["f1"] == pytest.approx(f1)


def test_span_text_gives_whole_characters_of_the_context(gpt2):
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
