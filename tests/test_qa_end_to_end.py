"""The real fairseq-train --user-dir trains a tiny QA model on binarised records until it answers; the prediction
script scores its checkpoint the same way; bad examples are counted, never a crash."""

import json
import re
import shutil

import pytest

from fairseq_clusterformer.ops.qa_metrics import nq_label_from_json, nq_scores
from tests.conftest import PACKAGE, run_ok
from tests.data.qa_model.synthetic import shared_data

pytestmark = pytest.mark.e2e

TRAIN = [
    "--user-dir",
    PACKAGE,
    "--task",
    "clusterformer_qa",
    "--arch",
    "clusterformer_qa_tiny",
    "--criterion",
    "clusterformer_qa",
    "--max-question-tokens",
    "40",
    "--optimizer",
    "adam",
    "--lr",
    "2e-3",
    "--lr-scheduler",
    "inverse_sqrt",
    "--warmup-updates",
    "30",
    "--batch-size",
    "8",
    "--dropout",
    "0",
    "--attention-dropout",
    "0",
    "--kmeans-backend",
    "torch",
    "--memory-size",
    "2000",
    "--cluster-update-interval",
    "50",
    "--cpu",
    "--num-workers",
    "0",
    "--no-epoch-checkpoints",
    "--log-interval",
    "50",
    "--validate-interval",
    "1000",
    "--best-checkpoint-metric",
    "em",
    "--maximize-best-checkpoint-metric",
    "--seed",
    "1",
]


def valid_lines(out):
    return [line for line in out.splitlines() if "valid on 'valid' subset" in line]


def metric(line, name):
    found = re.search(rf"\| {name} ([0-9.]+)", line)
    assert found, f"no {name} in: {line}"
    return float(found.group(1))


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


@pytest.fixture(scope="module")
def trained(qa_data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("qa_e2e_ckpt")
    out = run_ok("fairseq-train", qa_data, *TRAIN, "--max-update", "150", "--save-dir", save_dir)
    return out, save_dir


def test_tiny_qa_model_learns_to_answer(trained):
    out, _ = trained
    last = valid_lines(out)[-1]
    em, f1 = metric(last, "em"), metric(last, "f1")
    # a random span of a 100-400 token context is (almost) never the answer; the trained model often is
    assert em >= 25.0, last
    assert f1 >= em
    assert re.search(r"kmeans_refreshes[ =]([1-9])", out), "the centroids were never refreshed"
    assert "bin/valid: 40 of 40 examples kept; skipped: none" in out


def test_prediction_script_writes_squad_predictions_and_matches_validation(trained, qa_data, tmp_path):
    out, save_dir = trained
    em = metric(valid_lines(out)[-1], "em")
    pred = tmp_path / "pred.json"
    printed = run_ok(
        "fairseq-clusterformer-qa-predict",
        qa_data,
        "--path",
        save_dir / "checkpoint_last.pt",
        "--split",
        "valid",
        "--output",
        pred,
        "--cpu",
    )
    answers = json.loads(pred.read_text())
    metas = [json.loads(line) for line in (qa_data / "valid.meta.jsonl").read_text().splitlines()]
    assert set(answers) == {m["id"] for m in metas}
    assert all(isinstance(a, str) and a for a in answers.values())
    found = re.search(r"\| EM ([0-9.]+) \| F1 ([0-9.]+)", printed)
    assert found, printed[-2000:]
    assert float(found.group(1)) == pytest.approx(em, abs=0.01)
    exact = sum(answers[m["id"]] in m["answers"] for m in metas)
    assert float(found.group(1)) == pytest.approx(100.0 * exact / len(metas), abs=0.01)


def test_bad_examples_are_counted_and_training_goes_on(qa_data, tmp_path):
    data = tmp_path / "bin"
    shutil.copytree(qa_data, data)
    path = data / "valid.meta.jsonl"
    metas = [json.loads(line) for line in path.read_text().splitlines()]
    metas[0]["spans"] = [[3, 99_999]]
    metas[1]["paragraph_starts"] = [1]
    path.write_text("".join(json.dumps(m) + "\n" for m in metas))
    out = run_ok(
        "fairseq-train",
        data,
        *TRAIN,
        "--max-update",
        "3",
        "--max-context-eval",
        "250",
        "--no-save",
        "--save-dir",
        tmp_path / "ckpt",
    )
    kept = re.search(r"bin/valid: (\d+) of 40 examples kept; skipped: (.*)\(", out)
    assert kept, out[-3000:]
    assert "bad_span: 1" in kept.group(2) and "bad_paragraph_starts: 1" in kept.group(2)
    assert "context_too_long:" in kept.group(2)
    assert metric(valid_lines(out)[-1], "em") >= 0


def test_natural_questions_style_data_reports_long_and_short_f1(tmp_path_factory, tmp_path):
    data = shared_data(tmp_path_factory, nq=True)
    save_dir = tmp_path / "ckpt"
    out = run_ok(
        "fairseq-train",
        data,
        *TRAIN,
        "--max-update",
        "5",
        "--save-dir",
        save_dir,
        "--best-checkpoint-metric",
        "long_f1",
    )
    last = valid_lines(out)[-1]
    for name in ("long_f1", "short_f1", "em", "f1"):
        assert 0.0 <= metric(last, name) <= 100.0
    assert "type_loss" in last and "long_loss" in last
    # the prediction script writes nq_eval.py's format, and its scores are those of that file
    pred = tmp_path / "nq-pred.json"
    printed = run_ok(
        "fairseq-clusterformer-qa-predict", data, "--path", save_dir / "checkpoint_last.pt", "--output", pred, "--cpu"
    )
    predictions = json.loads(pred.read_text())["predictions"]
    metas = [json.loads(line) for line in (data / "valid.meta.jsonl").read_text().splitlines()]
    assert sorted(p["example_id"] for p in predictions) == sorted(m["extra"]["example_id"] for m in metas)
    for p in predictions:
        assert {"long_answer", "long_answer_score", "short_answers", "short_answers_score", "yes_no_answer"} <= set(p)
        assert set(p["long_answer"]) == {"start_token", "end_token", "start_byte", "end_byte"}
    golds = {m["extra"]["example_id"]: [nq_label_from_json(a) for a in m["extra"]["annotations"]] for m in metas}
    scores = nq_scores(golds, {p["example_id"]: nq_label_from_json(p) for p in predictions}, 1)
    found = re.search(r"\| long F1 ([0-9.]+) \| short F1 ([0-9.]+)", printed)
    assert found, printed[-2000:]
    assert float(found.group(1)) == pytest.approx(100 * scores["long-f1"], abs=0.01)
    assert float(found.group(2)) == pytest.approx(100 * scores["short-f1"], abs=0.01)
