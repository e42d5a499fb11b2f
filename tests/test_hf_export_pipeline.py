"""A QA model trained here (the real fairseq-train, 40 updates) exported by the real console script answers through
transformers as qa-ask (its hub interface) answers: in a fresh Python process with no network (sockets refused,
Hugging Face offline), AutoModelForQuestionAnswering and pipeline("question-answering", trust_remote_code=True) load
the folder, and the pipeline's answer to each of the 40 held-out questions (whole multi-paragraph contexts) is
qa-ask's: the same text, character span and score."""

import importlib
import json

import pytest

from fairseq_clusterformer.qa.model import ClusterFormerQAModel
from tests.conftest import run_ok, subprocess_env
from tests.test_hf_export import binarize_hf
from tests.test_qa_end_to_end import TRAIN

pytestmark = pytest.mark.e2e


def export_check():
    return importlib.import_module("benchmarks.hf_export_check")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = binarize_hf(tmp_path_factory.mktemp("hf_export_pipeline"))
    # the tiny QA recipe, shortened (a later flag wins): 40 updates, a K-Means refresh at 20
    flags = [*TRAIN, "--lr", "3e-3", "--warmup-updates", "15", "--cluster-update-interval", "20", "--max-update", "40",
             "--save-dir", root / "ckpt"]  # fmt: skip
    out = run_ok("fairseq-train", root / "bin", *flags)
    assert "kmeans_refreshes 1" in out  # the Cluster-Former layers' centroids were fitted once
    run_ok("fairseq-clusterformer-export-hf", root / "ckpt" / "checkpoint_last.pt", root / "export")
    return root


def test_the_pipeline_answers_held_out_questions_as_qa_ask_does(trained, tmp_path):
    records = [json.loads(line) for line in (trained / "valid.jsonl").read_text().splitlines()]
    questions = tmp_path / "questions.jsonl"
    with open(questions, "w", encoding="utf-8") as f:
        for r in records:  # paragraphs at blank lines, as qa-ask and the pipeline both split them
            f.write(json.dumps({"question": r["question"], "context": "\n\n".join(r["paragraphs"])}) + "\n")
    # qa-ask's answers are its hub interface's (tests/test_qa_ask.py holds the console script to them)
    hub = ClusterFormerQAModel.from_pretrained(str(trained / "ckpt"), "checkpoint_last.pt", cpu=True)
    items = [json.loads(line) for line in questions.read_text().splitlines()]
    expected = [answers[0].to_json() for answers in hub.answer_batch(items)]
    env = subprocess_env(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # the fresh, offline process benchmarks/hf_export_check.py runs on a recipe-trained MiniLM export
    loaded, got = export_check().pipeline_answers(trained / "export", questions, env)
    assert loaded["model"] == "ClusterFormerForQuestionAnswering" and loaded["pipeline"] == "ClusterFormerQAPipeline"
    config = json.loads((trained / "export" / "config.json").read_text())
    assert loaded["model_max_length"] == config["max_question_tokens"] + 3 + config["max_context_tokens"] + 1
    assert len(got) == len(expected) == 40
    for n, (ours, theirs) in enumerate(zip(got, expected)):
        assert (ours["answer"], ours["start"], ours["end"]) == (theirs["text"], theirs["start"], theirs["end"]), n
        assert abs(ours["score"] - theirs["score"]) < 1e-4, n
    right = sum(a["answer"] == r["answers"][0] for a, r in zip(got, records))
    assert right >= 4, f"{right} of 40 right: the model did not learn (chance is near 0)"
