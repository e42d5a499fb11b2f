"""A QA model trained here (the real fairseq-train, 40 updates) exported by the real console script answers through
transformers as qa-ask (its hub interface) answers: in a fresh Python process with no network (sockets refused,
Hugging Face offline), AutoModelForQuestionAnswering and pipeline("question-answering", trust_remote_code=True) load
the folder, and the pipeline's answer to each of the 40 held-out questions (whole multi-paragraph contexts) is
qa-ask's: the same text, character span and score."""

import json
import subprocess
import sys

import pytest

from fairseq_clusterformer.qa.model import ClusterFormerQAModel
from tests.conftest import run_ok, subprocess_env
from tests.test_hf_export import binarize_hf
from tests.test_qa_end_to_end import TRAIN

pytestmark = pytest.mark.e2e

FRESH_PROCESS = r'''
import json, socket, sys

def refuse(*args, **kwargs):
    raise OSError("no network in this test")

socket.socket.connect = socket.socket.connect_ex = refuse
from transformers import AutoModelForQuestionAnswering, AutoTokenizer, pipeline

folder, questions = sys.argv[1], sys.argv[2]
model = AutoModelForQuestionAnswering.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
qa = pipeline("question-answering", model=folder, trust_remote_code=True, local_files_only=True)
print(json.dumps({"model": type(model).__name__, "pipeline": type(qa).__name__,
                  "model_max_length": tokenizer.model_max_length}))
items = [json.loads(line) for line in open(questions, encoding="utf-8")]
for answer in qa([{"question": i["question"], "context": i["context"]} for i in items]):
    print(json.dumps(answer))
'''


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
    script = tmp_path / "fresh.py"
    script.write_text(FRESH_PROCESS)
    env = subprocess_env(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(script), str(trained / "export"), str(questions)], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    head, *lines = proc.stdout.strip().splitlines()
    loaded = json.loads(head)
    assert loaded["model"] == "ClusterFormerForQuestionAnswering" and loaded["pipeline"] == "ClusterFormerQAPipeline"
    config = json.loads((trained / "export" / "config.json").read_text())
    assert loaded["model_max_length"] == config["max_question_tokens"] + 3 + config["max_context_tokens"] + 1
    got = [json.loads(line) for line in lines]
    assert len(got) == len(expected) == 40
    for n, (ours, theirs) in enumerate(zip(got, expected)):
        assert (ours["answer"], ours["start"], ours["end"]) == (theirs["text"], theirs["start"], theirs["end"]), n
        assert abs(ours["score"] - theirs["score"]) < 1e-4, n
    right = sum(a["answer"] == r["answers"][0] for a, r in zip(got, records))
    assert right >= 4, f"{right} of 40 right: the model did not learn (chance is near 0)"
