"""The recall task (examples/longrange): the generator's documents against what its flags promise, the roles that
mark each recalled value and its first occurrence, and the recipe trained, scored and reported by its real scripts."""

import json
import random
import subprocess
import sys

import pytest
import torch

from fairseq_clusterformer.scripts.longrange import longrange_eval, recall_task
from fairseq_clusterformer.scripts.longrange.longrange_tally import ROLES
from tests.conftest import REPO, run_cli, run_ok, subprocess_env


def test_recall_task_documents(tmp_path):
    recall_task.main(["--out", str(tmp_path), "--train-docs", "5", "--valid-docs", "2", "--test-docs", "3",
                      "--length", "400", "--facts", "6", "--copies", "2", "--copy-length", "20",
                      "--min-distance", "150", "--max-distance", "300"])  # fmt: skip
    lines = (tmp_path / "test.txt").read_text().splitlines()
    records = [json.loads(line) for line in (tmp_path / "test.facts.jsonl").read_text().splitlines()]
    assert len(lines) == len(records) == 3
    for line, placed in zip(lines, records):
        words = line.split()
        facts = [r for r in placed if r["kind"] == "fact"]
        copies = [r for r in placed if r["kind"] == "copy"]
        assert len(words) == 400 and len(facts) == 6 and len(copies) == 2
        assert len({f["key"] for f in facts}) == 6  # distinct keys in a document
        taken = []
        for record in placed:
            width = 2 if record["kind"] == "fact" else 20
            first, recall = record["first"], record["recall"]
            assert 150 <= record["distance"] <= 300 and recall - first == record["distance"]
            assert words[first : first + width] == words[recall : recall + width]  # written twice, verbatim
            taken += [*range(first, first + width), *range(recall, recall + width)]
        assert len(taken) == len(set(taken)) == 4 * 6 + 2 * 2 * 20  # no span overwrote another
        for fact in facts:
            key, value = f"k{fact['key']}", f"v{fact['value']}"
            assert words[fact["first"] : fact["first"] + 2] == [key, value]
            assert words.count(key) == 2  # the recall's earlier occurrence is the fact itself, nothing nearer
        assert all(words[i].startswith("c") for c in copies for i in range(c["first"], c["first"] + 20))
        fillers = [w for w in words if w.startswith("w")]
        assert len(fillers) == 400 - len(taken) and all(0 <= int(w[1:]) < 16 for w in fillers)


def test_recall_task_cycle_filler(tmp_path):
    # --filler cycle: position i holds w[(start + i) % fillers] wherever no fact is written, so a filler word is
    # predictable from the word before it, or, just behind a fact, from the filler three words back
    recall_task.main(["--out", str(tmp_path), "--train-docs", "2", "--valid-docs", "1", "--test-docs", "4",
                      "--length", "300", "--facts", "10", "--fillers", "16", "--filler", "cycle",
                      "--min-distance", "130", "--max-distance", "250"])  # fmt: skip
    lines = (tmp_path / "test.txt").read_text().splitlines()
    records = [json.loads(line) for line in (tmp_path / "test.facts.jsonl").read_text().splitlines()]
    starts = set()
    for line, placed in zip(lines, records):
        words = line.split()
        facts = {i for r in placed for s in (r["first"], r["recall"]) for i in (s, s + 1)}
        assert len(facts) == 4 * 10 and all(not words[i].startswith("w") for i in facts)
        fillers = [(i, int(w[1:])) for i, w in enumerate(words) if i not in facts]
        assert all(w.startswith("w") for i, w in enumerate(words) if i not in facts)
        start = (fillers[0][1] - fillers[0][0]) % 16
        assert all(w == (start + i) % 16 for i, w in fillers)  # one cycle, carried on behind every fact
        starts.add(start)
    assert len(starts) > 1  # the cycle starts at a random word in each document
    with pytest.raises(ValueError, match="--filler"):
        recall_task.TaskShape(filler="zipf").check()
    with pytest.raises(ValueError, match="--loop-max"):
        recall_task.TaskShape(filler="loop", fillers=16, loop_max=20).check()


def test_recall_task_loop_filler_and_per_key_values(tmp_path):
    # --filler loop: each document repeats its own loop of 8..16 distinct fillers, so (outside the facts) a word
    # equals the word one period earlier; --value-vocab per-key: key k's value is one of v{k}_0 .. v{k}_{values-1}
    recall_task.main(["--out", str(tmp_path), "--train-docs", "1", "--valid-docs", "1", "--test-docs", "8",
                      "--length", "300", "--facts", "6", "--keys", "10", "--values", "5", "--fillers", "16",
                      "--filler", "loop", "--value-vocab", "per-key",
                      "--min-distance", "130", "--max-distance", "250"])  # fmt: skip
    lines = (tmp_path / "test.txt").read_text().splitlines()
    records = [json.loads(line) for line in (tmp_path / "test.facts.jsonl").read_text().splitlines()]
    periods = set()
    for line, placed in zip(lines, records):
        words = line.split()
        facts = {i for r in placed for s in (r["first"], r["recall"]) for i in (s, s + 1)}
        for r in placed:
            assert words[r["recall"] : r["recall"] + 2] == [f"k{r['key']}", f"v{r['key']}_{r['value']}"]
            assert 0 <= r["value"] < 5
        filler = {i: w for i, w in enumerate(words) if i not in facts}
        period = next(
            p for p in range(1, 17) if all(filler[i] == filler[i + p] for i in filler if i + p in filler)
        )  # the shortest shift that maps every filler onto the same word
        loop = set(filler.values())
        assert 8 <= period <= 16 and len(loop) == period  # distinct words: the successor of a word is determined
        periods.add(period)
    assert len(periods) > 1  # the period varies, so no fixed offset predicts the next filler


def test_recall_task_refuses_impossible_shapes(tmp_path):
    with pytest.raises(SystemExit):
        recall_task.main(["--out", str(tmp_path), "--length", "100", "--min-distance", "200"])
    with pytest.raises(ValueError, match="--facts"):
        recall_task.TaskShape(facts=200, keys=128).check()
    with pytest.raises(ValueError, match="--min-distance"):
        recall_task.TaskShape(min_distance=500, max_distance=400).check()
    with pytest.raises(ValueError, match="--min-distance 20: must be at least"):
        recall_task.TaskShape(copies=1, copy_length=32, min_distance=20).check()
    with pytest.raises(ValueError, match="too many"):
        recall_task.TaskShape(facts=0, copies=9, copy_length=32).check()
    with pytest.raises(ValueError, match="no room"):  # fits the word count, not the distances: lay_out says so
        recall_task.document(recall_task.TaskShape(facts=0, copies=7, copy_length=32), random.Random(0))
    recall_task.TaskShape(facts=0, copies=2, copy_length=32).check()  # copies alone are a task


def test_recall_roles_mark_the_recalled_answers(tmp_path):
    # two lines of 12 and 9 tokens (with end of line): a fact (value after the key) and a 3-word copy (the words
    # after its first), each marked where it is written the second time, and the first time as the control
    facts = tmp_path / "test.facts.jsonl"
    facts.write_text(
        json.dumps([{"kind": "fact", "first": 1, "recall": 7}]) + "\n"
        + json.dumps([{"kind": "copy", "length": 3, "first": 0, "recall": 4}]) + "\n"
    )  # fmt: skip
    documents = torch.tensor([0] * 12 + [1] * 9)
    roles = longrange_eval.recall_roles(facts, documents)
    named = {name: torch.nonzero(roles == i).flatten().tolist() for i, name in enumerate(ROLES)}
    assert named["recalled"] == [8, 12 + 5, 12 + 6]
    assert named["first occurrence"] == [2, 12 + 1, 12 + 2]
    with pytest.raises(SystemExit, match="2 documents, the split has 3 lines"):
        longrange_eval.recall_roles(facts, torch.tensor([0] * 12 + [1] * 9 + [2]))
    with pytest.raises(SystemExit, match="line 2 is too short"):
        longrange_eval.recall_roles(facts, torch.tensor([0] * 12 + [1] * 7))


@pytest.mark.e2e
def test_recall_recipe_trains_scores_and_reports_the_recalled_values(tmp_path):
    # examples/longrange at a tiny scale: the recall task, train.sh, the breakdown with --recall-facts (every recalled
    # value and every first occurrence scored once) and report.py's table with those two columns
    text, data, save = tmp_path / "text", tmp_path / "bin", tmp_path / "ckpt"
    recall_task.main(["--out", str(text), "--train-docs", "40", "--valid-docs", "4", "--test-docs", "6",
                      "--length", "63", "--facts", "3", "--fillers", "32", "--filler", "loop", "--loop-min", "3",
                      "--loop-max", "6", "--min-distance", "20", "--max-distance", "40"])  # fmt: skip
    run_ok("fairseq-preprocess", "--only-source", "--trainpref", text / "train.txt", "--validpref",
           text / "valid.txt", "--testpref", text / "test.txt", "--destdir", data, "--workers", "1")  # fmt: skip
    env = subprocess_env(TOKENS="64", BATCH="4", UPDATES="3", CLUSTERS="4")
    train = REPO / "examples" / "longrange" / "train.sh"
    flags = ["--disable-validation", "--memory-size", "500", "--cluster-update-interval", "2", "--kmeans-iters", "2"]
    # the fix this comparison led to: band sliding windows and next values (SLIDING and VALUES reach the flags)
    proc = subprocess.run(["bash", str(train), "cluster-strict", "1", str(data), str(save), *flags],
                          env=dict(env, SLIDING="band", VALUES="next"), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    checkpoint = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert checkpoint["optimizer_history"][-1]["num_updates"] == 3
    model_cfg = checkpoint["cfg"]["model"]
    assert model_cfg["window_size"] == 8 and model_cfg["num_clusters"] == 4
    assert model_cfg["sliding_windows"] == "band" and model_cfg["long_range_values"] == "next"
    results = tmp_path / "results" / "recall"
    results.mkdir(parents=True)
    run_ok("fairseq-clusterformer-longrange", data, "--path", save / "checkpoint_last.pt", "--tokens-per-sample", "64",
           "--context-window", "0", "--documents", "line", "--recall-facts", text / "test.facts.jsonl",
           "--json", results / "cluster-strict-s1.json")  # fmt: skip
    result = json.loads((results / "cluster-strict-s1.json").read_text())
    assert result["reach"] == 4 * 7  # the default windows of 8
    assert result["recall_task"]["recalled"]["tokens"] == result["recall_task"]["first occurrence"]["tokens"] == 18
    code, out = run_cli("fairseq-clusterformer-longrange", data, "--path", save / "checkpoint_last.pt",
                        "--recall-facts", text / "test.facts.jsonl")  # fmt: skip
    assert code != 0 and "--documents line" in out
    proc = subprocess.run(["bash", str(train), "dense", "1", str(data), str(save)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert proc.returncode == 2 and "KIND must be" in proc.stdout
    report = REPO / "examples" / "longrange" / "report.py"
    proc = subprocess.run([sys.executable, str(report), str(results.parent), "--out", str(tmp_path / "report")],
                          stdout=subprocess.PIPE, text=True, check=True)  # fmt: skip
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| cluster-strict |"))
    recalled = f"{result['recall_task']['recalled']['loss_nats']:.3f}"
    assert row.split(" | ")[-2] == recalled and (tmp_path / "report" / "loss_by_distance.png").is_file()
    assert row.split(" | ")[-3] == f"{result['mechanism']['recalled_held_share']:.3f}"
