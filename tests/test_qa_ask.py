"""Asking a QA model trained here (the real fairseq-train) about text given as a string or a file: the hub interface
(ClusterFormerQAModel.from_pretrained) answers exactly as qa-predict does through the binarised split, its character
offsets slice the user's text to the answer, a batch answers as its items do, bad input is named; the console script
(run as python -m fairseq_clusterformer.qa.scripts.ask) prints the same answers and streams JSON lines."""

import fcntl
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios

import pytest
import torch

from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit
from fairseq_clusterformer.qa.data.records import ANSWER_TYPES
from fairseq_clusterformer.qa.model import ClusterFormerQAModel
from fairseq_clusterformer.qa.scripts import predict
from tests.conftest import REPO, TINY_LM_TRAIN, run_ok
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_end_to_end import TRAIN

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


@pytest.fixture(scope="module")
def checkpoint(qa_data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("qa_ask_ckpt")
    run_ok("fairseq-train", qa_data, *TRAIN, "--max-update", "100", "--save-dir", save_dir)
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def hub(checkpoint):
    return ClusterFormerQAModel.from_pretrained(str(checkpoint.parent), "checkpoint_last.pt", cpu=True)


@pytest.fixture(scope="module")
def records(qa_data):
    """The valid split's source records (every one of them binarised, in order)."""
    return [json.loads(line) for line in (qa_data.parent / "valid.jsonl").read_text().splitlines()]


def ask(*args, stdin=None, tty=False):
    """(status, stdout, stderr) of the console script, run as a module (the shared venv has no entry point yet)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "fairseq_clusterformer.qa.scripts.ask", *map(str, args), "--cpu"]
    if not tty:
        proc = subprocess.run(command, input=stdin, capture_output=True, text=True, env=env, timeout=600)
        return proc.returncode, proc.stdout, proc.stderr
    leader, follower = pty.openpty()  # standard error on a terminal of 24 x 120, as a user's shell gives it
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=follower, text=True, env=env)
    os.close(follower)
    chunks = []
    while True:  # drained while it runs: a full terminal buffer would block the script
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the script exited and closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out, b"".join(chunks).decode("utf-8", "replace")


def test_the_hub_answers_as_qa_predict_does(hub, checkpoint, qa_data, records, tmp_path):
    """Same ids as the binarised split, the same span text and score as qa-predict's decoding (in-process, for the
    scores), the same text as the real qa-predict's prediction file; the offsets slice the context to the text."""
    split = QABinarizedSplit(str(qa_data), "valid")
    args = predict.get_parser().parse_args([str(qa_data), "--path", str(checkpoint), "--output", "-", "--cpu"])
    model, task = predict.load(args)
    expected = {i: (task.answer_text("valid", i, p.start, p.end), p.span_score)
                for i, p in predict.predict(model, task, "valid", 4)}  # fmt: skip
    out = tmp_path / "pred.json"
    run_ok("fairseq-clusterformer-qa-predict", qa_data, "--path", checkpoint, "--output", out, "--cpu")
    written = json.loads(out.read_text())
    assert len(expected) == len(records) == len(split) == 40
    for i, record in enumerate(records):
        context = "\n\n".join(record["paragraphs"])
        encoded = hub.encode(record["question"], context)
        assert encoded.question.tolist() == split[i].question.tolist()
        assert encoded.context.tolist() == split[i].context.tolist()
        (best,) = hub.answer(record["question"], context)
        assert best.text == expected[i][0] == written[record["id"]]
        assert best.score == pytest.approx(expected[i][1], abs=1e-5)
        assert context[best.start : best.end] == best.text and best.truncated_at is None
    right = sum(hub.answer(r["question"], "\n\n".join(r["paragraphs"]))[0].text in r["answers"] for r in records)
    assert right >= 10, right  # the model learned something: a random span is (almost) never the answer


def odd(record, n):
    """The record's context with odd whitespace between and around its paragraphs and non-ASCII words in them."""
    words = ["café", "naïve", "日本語", "🙂", "Ünïcödé", "ﬁne"]
    paragraphs = [
        p.replace(" is ", f" is {words[(n + k) % len(words)]} ", 1) for k, p in enumerate(record["paragraphs"])
    ]
    return paragraphs, " \t\r\n" + "\r\n \r\n\t\u3000".join(paragraphs) + "\n\n  "


def test_offsets_slice_the_users_text_with_non_ascii_and_odd_whitespace(hub, records):
    """Every answer of the top 5 is the user's text at its offsets, stripped and not empty; paragraph breaks of any
    whitespace give the answers of the same paragraphs joined by blank lines."""
    for n, record in enumerate(records[:12]):
        paragraphs, context = odd(record, n)
        answers = hub.answer(record["question"], context, top_k=5)
        plain = hub.answer(record["question"], "\n\n".join(paragraphs), top_k=5)
        assert len(answers) == 5
        for a, b in zip(answers, plain):
            assert context[a.start : a.end] == a.text == a.text.strip() != ""
            assert a.text == b.text and a.score == pytest.approx(b.score, abs=1e-5)


def test_a_batch_answers_as_its_items_do_one_by_one(hub, records):
    items = [(r["question"], odd(r, n)[1]) for n, r in enumerate(records[:10])]
    batched = hub.answer_batch(items, top_k=3, batch_size=4)
    for (question, context), together in zip(items, batched):
        alone = hub.answer(question, context, top_k=3)
        assert [(a.text, a.start, a.end) for a in together] == [(a.text, a.start, a.end) for a in alone]
        assert [a.score for a in together] == pytest.approx([a.score for a in alone], abs=1e-5)


def test_top_answers_are_ranked_and_the_first_is_the_best(hub, records):
    for record in records[:5]:
        context = "\n\n".join(record["paragraphs"])
        top = hub.answer(record["question"], context, top_k=8)
        assert [a.score for a in top] == sorted((a.score for a in top), reverse=True)
        assert top[0] == hub.answer(record["question"], context)[0]


def test_a_long_context_is_refused_or_cut_as_the_caller_chooses(checkpoint, records):
    short = ClusterFormerQAModel.from_pretrained(str(checkpoint), max_context_eval=40, cpu=True)
    assert short.max_context_tokens == 40
    record = records[0]
    context = "\n\n".join(record["paragraphs"])
    with pytest.raises(ValueError, match=r"the context has \d+ tokens, over the model's --max-context-eval 40"):
        short.answer(record["question"], context)
    encoded = short.encode(record["question"], context, overflow="truncate")
    assert len(encoded.context) == 40 and 0 < encoded.truncated_at < len(context)
    for answer in short.answer(record["question"], context, top_k=3, overflow="truncate"):
        assert answer.truncated_at == encoded.truncated_at and answer.end <= answer.truncated_at
        assert context[answer.start : answer.end] == answer.text


@pytest.mark.parametrize(
    "question, context, message",
    [
        ("", "some text", "the question is empty"),
        ("what is it ?", " \n\n\t ", "the context is empty"),
        ("what is it ?", b"bytes", "the context must be a string, got bytes"),
        ("what is " * 40, "some text", r"the question has \d+ tokens, over the model's --max-question-tokens 40"),
    ],
)
def test_bad_questions_and_contexts_are_named(hub, question, context, message):
    with pytest.raises(ValueError, match=message):
        hub.answer(question, context)
    with pytest.raises(ValueError, match=f"item 1: {message}"):
        hub.answer_batch([("what is it ?", "some text"), (question, context)])


def test_a_checkpoint_moved_from_the_machine_that_trained_it(checkpoint, qa_data, records, hub, tmp_path):
    """Its recorded data folder and tokeniser paths gone: the copies beside the checkpoint are used."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state["cfg"]["task"]["data"] = "/trainer/machine/data-bin"
    moved = tmp_path / "moved"
    moved.mkdir()
    torch.save(state, moved / "model.pt")
    config = json.loads((qa_data / "qa_config.json").read_text())
    shutil.copy(config["sentencepiece_model"], moved / "qa.model")
    config["sentencepiece_model"] = "/trainer/machine/spm/qa.model"
    with pytest.raises(FileNotFoundError, match="no data folder with dict.txt and qa_config.json at /trainer/machine"):
        ClusterFormerQAModel.from_pretrained(str(moved), "model.pt", cpu=True)
    (moved / "qa_config.json").write_text(json.dumps(config))
    shutil.copy(qa_data / "dict.txt", moved / "dict.txt")
    again = ClusterFormerQAModel.from_pretrained(str(moved), "model.pt", cpu=True)
    assert again.tokenizer.model_path == str(moved / "qa.model")
    context = "\n\n".join(records[3]["paragraphs"])
    assert again.answer(records[3]["question"], context) == hub.answer(records[3]["question"], context)


def test_a_natural_questions_model_answers_with_its_answer_type(tmp_path_factory):
    """NQ heads (read off the weights: the data folder beside the checkpoint holds no split saying so): each answer
    carries the answer-type head's class, and span, score and class are qa-predict's decoding of the split."""
    data = shared_data(tmp_path_factory, nq=True)
    save = tmp_path_factory.mktemp("qa_ask_nq")
    run_ok("fairseq-train", data, *TRAIN, "--max-update", "5", "--save-dir", save,
           "--best-checkpoint-metric", "long_f1")  # fmt: skip
    for name in ("dict.txt", "qa_config.json"):
        shutil.copy(data / name, save / name)
    hub = ClusterFormerQAModel.from_pretrained(str(save), "checkpoint_last.pt", data_name_or_path=".", cpu=True)
    assert hub.model.qa_heads.answer_type is not None
    path = str(save / "checkpoint_last.pt")
    model, task = predict.load(predict.get_parser().parse_args([str(data), "--path", path, "--output", "-", "--cpu"]))
    expected = dict(predict.predict(model, task, "valid", 4))
    records = [json.loads(line) for line in (data.parent / "valid.jsonl").read_text().splitlines()]
    for i, record in enumerate(records):
        context = "\n\n".join(record["paragraphs"])
        (best,) = hub.answer(record["question"], context)
        assert best.answer_type == ANSWER_TYPES[expected[i].answer_type]
        assert best.score == pytest.approx(expected[i].span_score, abs=1e-5)
        assert best.text == task.answer_text("valid", i, expected[i].start, expected[i].end)


def test_the_console_script_prints_the_hubs_answer(hub, checkpoint, records, tmp_path):
    paragraphs, context = odd(records[1], 1)
    path = tmp_path / "doc.txt"
    path.write_bytes(context.encode("utf-8"))  # the file's characters as they are, \r\n included
    best = hub.answer(records[1]["question"], context)[0]
    code, out, err = ask("--path", checkpoint, "--question", records[1]["question"], "--context", path)
    assert code == 0, err
    assert out.splitlines() == [
        f"answer: {best.text}", f"score: {best.score:.4f}", f"span: characters {best.start}-{best.end} of {path}"
    ]  # fmt: skip
    code, out, err = ask("--path", checkpoint, "--question", records[1]["question"], "--context", "-", stdin=context)
    assert code == 0 and f"span: characters {best.start}-{best.end} of standard input" in out, err


def test_the_console_script_streams_json_lines_and_names_bad_ones(hub, checkpoint, records, tmp_path):
    lines = [json.dumps({"id": r["id"], "question": r["question"], "context": odd(r, n)[1]})
             for n, r in enumerate(records[:5])]  # fmt: skip
    lines[2:2] = ["{not json", json.dumps({"question": "what ?", "context": "\n"})]
    path = tmp_path / "questions.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = ask("--path", checkpoint, "--jsonl", path, "--top-k", "2", "--batch-size", "2")
    assert code == 1
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["line"] for row in rows] == list(range(1, 8))
    assert f"{path}:3: not valid JSON" in err and f"{path}:4: the context is empty" in err
    assert f"{path}: 2 line(s) could not be answered (first at line 3)" in err
    assert not re.search(r"\d questions \[", err)  # no progress bar off a terminal
    answered = [row for row in rows if "answers" in row]
    for n, (row, record) in enumerate(zip(answered, records)):
        expected = hub.answer(record["question"], odd(record, n)[1], top_k=2)
        assert row["id"] == record["id"]
        assert [(a["text"], a["start"], a["end"]) for a in row["answers"]] == [
            (a.text, a.start, a.end) for a in expected
        ]
    code, out, err = ask("--path", checkpoint, "--jsonl", "-", "--top-k", "2", stdin=lines[0] + "\n")
    assert code == 0 and [json.loads(line) for line in out.splitlines()] == rows[:1], err
    code, out, err = ask("--path", checkpoint, "--jsonl", path, tty=True)
    assert code == 1 and re.search(r"7 questions \[", err) and len(out.splitlines()) == 7


def test_the_console_script_names_bad_input(checkpoint, lm_checkpoint, tmp_path):
    text = tmp_path / "doc.txt"
    text.write_text("the secret word is amber .")
    code, _, err = ask("--path", checkpoint, "--question", "what ?", "--context", checkpoint)
    assert code == 1 and f"--context {checkpoint}: not UTF-8 text (byte 0x" in err
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"text\x00more")
    code, _, err = ask("--path", checkpoint, "--question", "what ?", "--context", nul)
    assert code == 1 and f"--context {nul}: not a text file (it holds NUL bytes at byte 5)" in err
    code, _, err = ask("--path", checkpoint, "--question", " ", "--context", text)
    assert code == 1 and "--question: the question is empty" in err
    code, _, err = ask("--path", lm_checkpoint, "--question", "what ?", "--context", text)
    assert code == 1 and f"--path {lm_checkpoint} is not a question-answering checkpoint" in err
    assert "(--arch clusterformer_lm_tiny, --task clusterformer_lm)" in err
    code, _, err = ask("--path", checkpoint, "--question", "what ?", "--context", text, "--max-context-eval", "3")
    assert code == 1 and f"--context {text}: the context has " in err and "over the model's --max-context-eval 3" in err
    code, out, err = ask("--path", checkpoint, "--question", "what ?", "--context", text, "--max-context-eval", "3",
                         "--context-overflow", "truncate")  # fmt: skip
    assert code == 0 and "note: the context was cut to its first 3 tokens (--max-context-eval)" in out, err
    code, _, err = ask("--path", checkpoint, "--question", "what ?", "--context", tmp_path / "missing.txt")
    assert code == 1 and f"--context {tmp_path / 'missing.txt'}: no such file" in err


@pytest.fixture(scope="module")
def lm_checkpoint(lm_data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("qa_ask_lm")
    run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, "--memory-size", "2000", "--no-epoch-checkpoints",
           "--max-update", "1", "--save-dir", save_dir)  # fmt: skip
    return save_dir / "checkpoint_last.pt"
