"""Natural Questions as the official nq_eval.py scores it: the 2-of-5 vote passed by eval.sh, the best-threshold
numbers beside the all-answers ones, a prediction for every example id (those the dataset, the binariser or the
converter skipped included), and nested gold long answers."""

import gzip
import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit, span_in_paragraph
from fairseq_clusterformer.qa.data.predictions import nq_prediction, with_null_predictions, write_nq_predictions
from fairseq_clusterformer.qa.ops import metrics as m
from fairseq_clusterformer.qa.ops.metrics import NQLabel, nq_label_from_json, nq_scores
from fairseq_clusterformer.qa.ops.spans import AnswerPrediction
from fairseq_clusterformer.qa.scripts import convert as qa_convert
from fairseq_clusterformer.qa.scripts import predict as qa_predict
from tests.conftest import REPO, subprocess_env
from tests.test_qa_binarize import GPT2_FLAGS, binarize_ok, check_split, convert_ok, gpt2, run_inprocess  # noqa: F401 (gpt2: a fixture)
from tests.test_qa_convert import NQ_TEXT, nq_example

TOKENS = NQ_TEXT.split(" ")
TABLE = TOKENS.index("<Table>")
NESTED = (TABLE + 1, len(TOKENS) - 1)  # the <Tr> row inside the top-level table, candidate 2 of nq_example


def five(*long_spans):
    """Five annotations: the given long answers, the rest null."""
    spans = list(long_spans) + [(-1, -1)] * (5 - len(long_spans))
    return [NQLabel(long_answer=s) for s in spans]


def test_report_gives_best_threshold_numbers_beside_all_answers():
    # long answers, 2-of-5 vote: a, b and c have gold; d does not. The confident predictions are right, the least
    # confident one (score 0.1, on d) is wrong and a (score 0.2) is answered wrongly.
    golds = {
        "a": five((0, 5), (0, 5)),
        "b": five((5, 9), (5, 9), (5, 9)),
        "c": five((9, 12), (9, 12)),
        "d": five((1, 2)),  # one vote: no gold answer
    }
    preds = {
        "a": NQLabel(long_answer=(0, 4), long_score=0.2),
        "b": NQLabel(long_answer=(5, 9), long_score=0.9),
        "c": NQLabel(long_answer=(9, 12), long_score=0.8),
        "d": NQLabel(long_answer=(1, 2), long_score=0.1),
    }
    scores = m.nq_scores(golds, preds, non_null_threshold=2)
    # all answers: 2 correct of 4 predicted, 3 gold: P 1/2, R 2/3, F1 4/7; cut at 0.8: P 1, R 2/3, F1 0.8
    assert scores["long-f1"] == pytest.approx(4 / 7)
    assert scores["long-best-threshold-f1"] == pytest.approx(0.8)
    assert scores["long-best-threshold-threshold"] == 0.8
    every, best = qa_predict.nq_report(scores, 2)
    assert every.startswith("| long F1 57.14 | short F1 0.00 |") and "long 50.00 / 66.67" in every
    assert ">= 2 annotations" in every
    assert best.startswith("| best threshold: long F1 80.00 (P 100.00 R 66.67 at score >= 0.8)")
    # the official vote: with a threshold of 1, d's single annotation makes gold and its prediction right
    assert m.nq_scores(golds, preds, non_null_threshold=1)["long-f1"] == pytest.approx(3 / 4)


def fake_predict_tool(tmp_path):
    """A stand-in for fairseq-clusterformer-qa-predict that prints the arguments eval.sh gives it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "fairseq-clusterformer-qa-predict"
    tool.write_text('#!/usr/bin/env bash\necho "| args: $*"\n')
    tool.chmod(0o755)
    env = subprocess_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"  # the stand-in before the real tool
    return env


@pytest.mark.parametrize("threshold, expected", [(None, "2"), ("1", "1")])
def test_eval_sh_passes_the_nq_threshold(tmp_path, threshold, expected):
    env = fake_predict_tool(tmp_path)
    env.pop("NQ_THRESHOLD", None)
    if threshold is not None:
        env["NQ_THRESHOLD"] = threshold
    script = REPO / "examples" / "qa" / "eval.sh"
    proc = subprocess.run(
        ["bash", str(script), "data-bin/nq", "ckpt/checkpoint_best.pt"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.split()
    assert args[args.index("--nq-threshold") + 1] == expected


def test_null_predictions_fill_every_missing_id_below_every_score():
    given = {
        7: {**nq_prediction_stub(7), "long_answer_score": -0.5, "short_answers_score": 3.0},
        -3: {**nq_prediction_stub(-3), "long_answer_score": -2.0, "short_answers_score": float("-inf")},
    }
    written = with_null_predictions(given, [5, 7, -3, 11])
    assert [p["example_id"] for p in written] == [5, 7, -3, 11]
    assert written[1] == given[7] and written[2] == given[-3]
    for filled in (written[0], written[3]):
        # one below the lowest finite score, and a null answer that nq_eval.py reads as "no answer"
        assert filled["long_answer_score"] == filled["short_answers_score"] == -3.0
        assert filled["long_answer"]["start_token"] == -1 and filled["short_answers"] == []
        assert set(filled["long_answer"]) == {"start_token", "end_token", "start_byte", "end_byte"}
    with pytest.raises(ValueError, match="not in the split"):
        with_null_predictions(given, [7])


def nq_prediction_stub(example_id):
    return {
        "example_id": example_id,
        "long_answer": {"start_token": 10, "end_token": 24, "start_byte": -1, "end_byte": -1},
        "short_answers": [],
        "yes_no_answer": "NONE",
    }


def binarized_nq(tmp_path, lines):
    src = tmp_path / "nq.jsonl.gz"
    src.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    code, converter_log = run_inprocess(qa_convert, "--format", "nq", src, tmp_path / "nq.jsonl")
    assert code == 0, converter_log[-3000:]
    binarize_ok(*GPT2_FLAGS, "--valid", tmp_path / "nq.jsonl", "--destdir", tmp_path / "bin")
    return QABinarizedSplit(str(tmp_path / "bin"), "valid"), converter_log


def run_predict(tmp_path, monkeypatch, data, results):
    """qa_predict.main on binarised ``data`` with the model's answers replaced by ``results`` (example index,
    AnswerPrediction): (scores, the written predictions)."""
    dataset = SimpleNamespace(report=lambda: f"{len(results)} of {len(data)} examples kept", moves_positions=False)
    task = SimpleNamespace(answer_types=True, split_data=lambda split: data, dataset=lambda split: dataset)
    monkeypatch.setattr(qa_predict, "load", lambda args: (None, task))
    monkeypatch.setattr(qa_predict, "predict", lambda model, task, split, batch_size: iter(results))
    out = tmp_path / "pred.json"
    args = qa_predict.get_parser().parse_args([str(tmp_path / "bin"), "--path", "x.pt", "--output", str(out)])
    scores = qa_predict.main(args)
    return scores, json.loads(out.read_text())["predictions"]


def first_answer(data):
    """The gold short answer of the first example as the model's answer."""
    meta = data.metas[0]
    start, end = meta["spans"][0]
    return [(0, AnswerPrediction(2, start, end, 5.0, meta["long_answer"], -0.1))]


def test_prediction_script_writes_every_example_id(tmp_path, monkeypatch, capsys):
    """The model reads only the first example (the dataset skipped the others); the file still has all three ids,
    which is what nq_eval.py requires, and the skipped ones count as unanswered."""
    data, _ = binarized_nq(tmp_path, [nq_example(), nq_example(7), nq_example(-3)])
    scores, written = run_predict(tmp_path, monkeypatch, data, first_answer(data))
    assert [p["example_id"] for p in written] == [4417329003155830911, 7, -3]
    assert written[0]["long_answer"]["start_token"] == 10 and written[0]["long_answer_score"] == -0.1
    assert [p["long_answer"]["start_token"] for p in written[1:]] == [-1, -1]
    assert max(p["long_answer_score"] for p in written[1:]) < -0.1
    # single-annotation gold (threshold 1): 1 of 3 answered, and right
    assert scores["long-precision"] == 1.0 and scores["long-recall"] == pytest.approx(1 / 3)
    assert "1 of 3 questions answered" in capsys.readouterr().out


def test_examples_skipped_before_the_dataset_get_null_predictions(tmp_path, monkeypatch, capsys):
    """One example the converter skips (no top-level candidate) and one the binariser skips (a question over
    --max-question-tokens): the file still holds their ids, and their gold answers count in the recall."""
    no_top_level = nq_example(7)
    for candidate in no_top_level["long_answer_candidates"]:
        candidate["top_level"] = False
    long_question = {**nq_example(-3), "question_text": "who " * 80 + "painted the starry night"}
    data, _ = binarized_nq(tmp_path, [nq_example(), no_top_level, long_question])
    assert len(data) == 1
    skipped = data.config["splits"]["valid"]["skipped_examples"]
    assert [(e["id"], e["example_id"], e["reason"]) for e in skipped] == [
        ("7", 7, "empty_context"),
        ("-3", -3, "question_too_long"),
    ]
    assert all(len(e["annotations"]) == 1 for e in skipped)
    scores, written = run_predict(tmp_path, monkeypatch, data, first_answer(data))
    assert [p["example_id"] for p in written] == [4417329003155830911, 7, -3]
    assert [p["long_answer"]["start_token"] for p in written] == [10, -1, -1]
    assert [p["yes_no_answer"] for p in written] == ["NONE"] * 3 and written[2]["short_answers"] == []
    # all three have a gold long answer (threshold 1): 1 of 3 found
    assert scores["long-precision"] == 1.0 and scores["long-recall"] == pytest.approx(1 / 3)
    assert "1 of 3 questions answered" in capsys.readouterr().out


def test_nested_gold_long_answer_keeps_its_own_span(tmp_path):
    nested = {
        "long_answer": {"start_token": NESTED[0], "end_token": NESTED[1], "candidate_index": 2},
        "short_answers": [{"start_token": NESTED[1] - 5, "end_token": NESTED[1] - 2}],  # Vincent van Gogh
        "yes_no_answer": "NONE",
    }
    data, converter_log = binarized_nq(tmp_path, [nq_example(-3, [nested] * 2), nq_example()])
    assert "nested_long_answer=1" in converter_log  # the converter counts the example
    meta = data.metas[0]
    assert meta["long_answer"] == 1  # the model learns the enclosing table, its only paragraph for it
    assert meta["extra"]["long_answer_tokens"] == list(NESTED)
    assert data.metas[1]["extra"]["long_answer_tokens"] == [10, 24]  # a top-level gold is its candidate
    gold = [m.nq_label_from_json(a) for a in meta["extra"]["annotations"]]
    # the official rule compares spans: the table's span is not the annotated row's, the row's span is
    table = nq_prediction(data.tokenizer, data[0].context, meta, "long", 1, 0.0)
    assert (table["long_answer"]["start_token"], table["long_answer"]["end_token"]) == (TABLE, len(TOKENS))
    assert m.score_long(gold, m.nq_label_from_json(table)) == (True, True, False, 0.0)
    assert m.score_long(gold, NQLabel(long_answer=NESTED))[2]


def test_prediction_script_refuses_contexts_cut_around_the_answers(tmp_path, monkeypatch):
    """A training split cut around its gold paragraphs has moved offsets: NQ predictions would point elsewhere."""
    from fairseq_clusterformer.qa.scripts import predict as qa_predict

    dataset = SimpleNamespace(report=lambda: "3 of 3 examples kept", moves_positions=True)
    task = SimpleNamespace(
        answer_types=True, split_data=lambda split: SimpleNamespace(texts=None), dataset=lambda split: dataset
    )
    monkeypatch.setattr(qa_predict, "load", lambda args: (None, task))
    monkeypatch.setattr(qa_predict, "predict", lambda model, task, split, batch_size: iter([]))
    args = qa_predict.get_parser().parse_args(
        [str(tmp_path), "--path", "x.pt", "--split", "train", "--output", str(tmp_path / "p.json")]
    )
    with pytest.raises(SystemExit, match="--split train: its contexts were cut around the gold answers"):
        qa_predict.main(args)


def test_nq_gold_spans_round_trip_to_official_predictions(tmp_path, gpt2):  # noqa: F811
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
