"""The real fairseq-train --user-dir trains a tiny QA model on binarised records until it answers; the prediction
script scores its checkpoint the same way; bad examples are counted, never a crash."""

import json
import re
import shutil
import string
from collections import Counter

import pytest

from fairseq_clusterformer.qa.ops.metrics import nq_label_from_json, nq_scores, squad_scores
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
    assert "bin/valid: 40 of 40 examples kept, 0 of them truncated (first tokens); skipped: none" in out


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
    f1 = sum(max(squad_f1(answers[m["id"]], gold) for gold in m["answers"]) for m in metas)
    assert float(found.group(2)) == pytest.approx(100.0 * f1 / len(metas), abs=0.01)


def squad_f1(prediction: str, gold: str) -> float:
    """SQuAD v1.1's token F1, written out here so that the scorer is checked against something it does not call."""

    def words(text):
        text = "".join(c for c in text.lower() if c not in string.punctuation)
        return [w for w in text.split() if w not in ("a", "an", "the")]

    pred, ref = words(prediction), words(gold)
    common = sum((Counter(pred) & Counter(ref)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def test_wrong_answers_score_zero_and_right_ones_a_hundred(qa_data):
    """The scorer the prediction script uses: a model that always answers wrongly gets EM 0, a right one 100,
    and a span with extra words EM 0 and exactly the F1 worked out by hand."""
    metas = [json.loads(line) for line in (qa_data / "valid.meta.jsonl").read_text().splitlines()]
    golds = {m["id"]: m["answers"] for m in metas}
    right = squad_scores(golds, {m["id"]: m["answers"][0] for m in metas})
    assert (right["exact_match"], right["f1"]) == (100.0, 100.0)
    wrong = squad_scores(golds, {m["id"]: "what is the secret word" for m in metas})
    assert (wrong["exact_match"], wrong["f1"]) == (0.0, 0.0)
    # "word is X": 3 predicted tokens, 1 gold token, 1 in common -> P = 1/3, R = 1, F1 = 1/2
    wider = squad_scores(golds, {m["id"]: f"word is {m['answers'][0]}" for m in metas})
    assert wider["exact_match"] == 0.0
    assert wider["f1"] == pytest.approx(100.0 * squad_f1("word is amber", "amber"), abs=1e-9)
    assert wider["f1"] == pytest.approx(100.0 * 2 * (1 / 3) / (1 / 3 + 1), abs=1e-9)
    half = squad_scores(golds, {m["id"]: m["answers"][0] if i % 2 else "xenon-not" for i, m in enumerate(metas)})
    assert half["exact_match"] == pytest.approx(100.0 * (len(metas) // 2) / len(metas))


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
    # the default --context-overflow truncate keeps the long contexts: only the two bad examples are left out
    kept = re.search(
        r"bin/valid: 38 of 40 examples kept, (\d+) of them truncated \(first tokens\); skipped: ([^;]*);", out
    )
    assert kept, out[-3000:]
    assert int(kept.group(1)) > 0 and kept.group(2) == "bad_paragraph_starts: 1, bad_span: 1"
    assert valid_lines(out), "validation never ran on the kept examples"


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
    found = re.search(r"\| long F1 ([0-9.]+) \| short F1 ([0-9.]+)", printed)
    assert found, printed[-2000:]
    # two implementations agree: the criterion's (context-token space) and nq_eval's rules on the file
    assert float(found.group(1)) == pytest.approx(metric(last, "long_f1"), abs=0.01)
    assert float(found.group(2)) == pytest.approx(metric(last, "short_f1"), abs=0.01)
    # and that scorer gives the gold annotations 100 and answers in the wrong paragraph 0
    golds = {m["extra"]["example_id"]: [nq_label_from_json(a) for a in m["extra"]["annotations"]] for m in metas}
    right = {k: v[0] for k, v in golds.items()}
    shifted = {k: nq_label_from_json(shift(m["extra"])) for m in metas for k in [m["extra"]["example_id"]]}
    assert (nq_scores(golds, right, 1)["long-f1"], nq_scores(golds, right, 1)["short-f1"]) == (1.0, 1.0)
    assert (nq_scores(golds, shifted, 1)["long-f1"], nq_scores(golds, shifted, 1)["short-f1"]) == (0.0, 0.0)


def shift(extra: dict) -> dict:
    """An always-answering prediction one paragraph away from the gold one (the first, for unanswered ones)."""
    gold = extra["annotations"][0]["long_answer"]["candidate_index"]
    candidate = extra["candidates"][(gold + 1) % len(extra["candidates"]) if gold >= 0 else 0]
    first = candidate["start_token"]
    return {
        "long_answer": {"start_token": first, "end_token": candidate["end_token"]},
        "short_answers": [{"start_token": first, "end_token": first + 1}],
        "yes_no_answer": "NONE",
    }
