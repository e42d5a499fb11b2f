"""The QA binariser: exact char -> token span mapping (GPT-2 BPE and sentencepiece), the binarised format read back
through fairseq, bad input, and the official prediction writers."""

import contextlib
import io
import json
import sys
from unittest import mock

import numpy as np
import pytest
from fairseq.data import Dictionary, data_utils

from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit
from fairseq_clusterformer.qa.data.predictions import write_squad_predictions
from fairseq_clusterformer.qa.data.records import QARecord
from fairseq_clusterformer.qa.data.tokenizers import GPT2BPETokenizer, SentencePieceTokenizer, add_paragraph_token
from fairseq_clusterformer.qa.ops.metrics import squad_scores
from fairseq_clusterformer.qa.scripts import binarize as qa_binarize
from fairseq_clusterformer.qa.scripts import convert as qa_convert
from tests.conftest import run_ok
from tests.test_qa_convert import DATA

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


SCORES = "Mars is the fourth planet; in 1949 it had 49 visitors and Phobos."


def scores_record(rid, answer, start):
    assert SCORES[start : start + len(answer)] == answer
    return QARecord(
        id=rid, question="How many?", paragraphs=[SCORES], answers=[answer], spans=[[0, start, start + len(answer)]]
    )


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
