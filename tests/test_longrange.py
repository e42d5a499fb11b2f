"""The long-range breakdown and the recall task: bucket assignment and the mechanism statistic against brute-force
loops, the generator's dependency distances, and the breakdown on a model trained by the real fairseq-train."""

import itertools
import json
import random
import re
import subprocess
import sys
from math import comb

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_clusterformer.ops.recurrence import (
    BUCKETS,
    distance_buckets,
    log2_bins,
    previous_occurrence,
    random_hit_chance,
)
from fairseq_clusterformer.scripts.longrange import longrange_eval, recall_task
from fairseq_clusterformer.scripts.longrange.longrange_tally import ROLES, Tally
from tests.conftest import PACKAGE, REPO, TINY_LM_TRAIN, run_cli, run_ok, subprocess_env

streams = st.lists(st.integers(0, 5), min_size=1, max_size=60)


def brute_previous(tokens, documents):
    return [
        max((p for p in range(j) if tokens[p] == tokens[j] and documents[p] == documents[j]), default=-1)
        for j in range(len(tokens))
    ]


def brute_bucket(j, tokens, documents, input_start, reach):
    earlier = [p for p in range(j) if tokens[p] == tokens[j] and documents[p] == documents[j]]
    if not earlier:
        return "never"
    p = earlier[-1]
    if p < input_start:
        return "beyond input"
    return "within reach" if j - 1 - p <= reach else "beyond reach"


@given(streams, st.data())
@settings(max_examples=200, deadline=None)
def test_previous_occurrence_matches_a_loop(tokens, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(tokens)), max_size=4)))
    documents = [sum(j >= c for c in cuts) for j in range(len(tokens))]  # non-decreasing document ids
    got = previous_occurrence(torch.tensor(tokens), torch.tensor(documents))
    assert got.tolist() == brute_previous(tokens, documents)


@given(streams, st.integers(0, 8), st.data())
@settings(max_examples=200, deadline=None)
def test_buckets_match_a_loop(tokens, reach, data):
    n = len(tokens)
    documents = [0] * n
    targets = sorted(set(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n))))
    starts = [data.draw(st.integers(0, j)) for j in targets]  # the input begins at or before the token
    previous = previous_occurrence(torch.tensor(tokens))
    got = distance_buckets(torch.tensor(targets), previous, torch.tensor(starts), reach)
    expected = [brute_bucket(j, tokens, documents, s, reach) for j, s in zip(targets, starts)]
    assert [BUCKETS[b] for b in got.tolist()] == expected


def test_buckets_on_a_worked_example():
    # a b a c a with reach 1: the 'a' at 2 is 1 hop from the 'a' at 0 (held by position 0, predicted from 1)
    tokens = torch.tensor([0, 1, 0, 2, 0, 1])
    previous = previous_occurrence(tokens)
    assert previous.tolist() == [-1, -1, 0, -1, 2, 1]
    got = distance_buckets(torch.arange(6), previous, torch.tensor([0, 0, 0, 0, 0, 2]), reach=1)
    assert [BUCKETS[b] for b in got.tolist()] == [
        "never", "never", "within reach", "never", "within reach", "beyond input",
    ]  # fmt: skip
    # the last 1 is 5 - 1 - 1 = 3 hops from the first: beyond reach 2, within reach 3
    assert BUCKETS[int(distance_buckets(torch.tensor([5]), previous, torch.tensor([0]), reach=2))] == "beyond reach"
    assert BUCKETS[int(distance_buckets(torch.tensor([5]), previous, torch.tensor([0]), reach=3))] == "within reach"


def test_log2_bins():
    assert log2_bins(torch.tensor([1, 2, 3, 4, 7, 8, 1023, 1024])).tolist() == [0, 1, 1, 2, 2, 3, 9, 10]


@pytest.mark.parametrize("past,keys", [(5, 1), (5, 2), (6, 3), (7, 7), (4, 0)])
def test_random_hit_chance_is_exact(past, keys):
    # enumerate every key set: the share that holds position 0 or 1 (targets=2), or position 0 (targets=1)
    sets = list(itertools.combinations(range(past), keys))
    two = sum(bool({0, 1} & set(s)) for s in sets) / len(sets)
    one = sum(0 in s for s in sets) / len(sets)
    chance = random_hit_chance(torch.tensor([keys, keys]), torch.tensor([past, past]), targets=2)
    assert chance[0].item() == pytest.approx(two)
    assert random_hit_chance(torch.tensor([keys]), torch.tensor([past]), targets=1).item() == pytest.approx(one)
    assert one == pytest.approx(keys / past) and comb(past, keys) == len(sets)


class FakeCapture:
    def __init__(self, pairs):
        self.pairs, self.kinds = pairs, {3: "fake"}


def test_mechanism_counts_the_keys_of_far_tokens():
    # stream x y . . . . x y : the second y (position 7) has its earlier occurrence 6 back, beyond reach 2
    stream = torch.tensor([5, 6, 1, 2, 3, 4, 5, 6])
    tally = Tally(stream, torch.zeros_like(stream), reach=2)
    length = stream.numel()  # one input, x = [eos] + stream[:-1]: x position j predicts stream[j]
    hit_pairs = torch.zeros(length, length, dtype=torch.bool)
    hit_pairs[7, 2] = True  # the query predicting stream[7] sees x position 2, which holds stream[1]: a hit
    miss_pairs = torch.zeros(length, length, dtype=torch.bool)
    miss_pairs[7, 4] = True
    scores = torch.full((length,), -1.0)
    tally.add(torch.arange(length), scores, input_start=0, capture=FakeCapture({3: hit_pairs}), first=0)
    result = tally.summary()
    # far tokens: stream[6] = 5 (earlier at 0, 5 hops) and stream[7] = 6 (earlier at 1, 5 hops)
    assert result["buckets"]["beyond reach"]["tokens"] == 2
    assert result["mechanism"]["far_tokens"] == 2
    assert result["mechanism"]["layers"][0]["hit_share"] == 0.5
    assert result["mechanism"]["layers"][0]["held_share"] == 0.5
    assert result["mechanism"]["any_layer_held_share"] == 0.5
    tally = Tally(stream, torch.zeros_like(stream), reach=2)
    tally.add(torch.arange(length), scores, input_start=0, capture=FakeCapture({3: miss_pairs}), first=0)
    assert tally.summary()["mechanism"]["any_layer_hit_share"] == 0.0
    # x position 1 holds stream[0] and predicted stream[1]: an earlier occurrence's predecessor, which had not seen
    # it (a hit, but not the state holding it); the roles count the recalled values that read their answer
    predicted_pairs = torch.zeros(length, length, dtype=torch.bool)
    predicted_pairs[7, 1] = True
    predicted_pairs[6, 1] = True  # the query predicting stream[6] = 5 sees the state holding stream[0] = 5
    roles = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])  # both far tokens recalled
    tally = Tally(stream, torch.zeros_like(stream), reach=2, roles=roles)
    tally.add(torch.arange(length), scores, input_start=0, capture=FakeCapture({3: predicted_pairs}), first=0)
    mechanism = tally.summary()["mechanism"]
    assert mechanism["any_layer_hit_share"] == 1.0 and mechanism["any_layer_held_share"] == 0.5
    assert mechanism["recalled_far"] == 2 and mechanism["recalled_held_share"] == 0.5


def test_tally_sums_the_loss_of_each_role():
    stream = torch.tensor([5, 6, 1, 2, 3, 4, 5, 6])
    roles = torch.tensor([0, 2, 0, 0, 0, 0, 0, 1])  # stream[1] first written, stream[7] recalled
    tally = Tally(stream, torch.zeros_like(stream), reach=2, roles=roles)
    scores = -torch.arange(8.0)  # loss j at position j
    tally.add(torch.arange(4), scores[:4], input_start=0, capture=FakeCapture({}), first=0)
    tally.add(torch.arange(4, 8), scores[4:], input_start=0, capture=FakeCapture({}), first=0)
    summary = tally.summary()["recall_task"]
    assert summary["recalled"]["tokens"] == 1 and summary["recalled"]["loss_nats"] == 7.0
    assert summary["first occurrence"]["tokens"] == 1 and summary["first occurrence"]["loss_nats"] == 1.0
    assert "recall_task" not in Tally(stream, torch.zeros_like(stream), reach=2).summary()


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
def test_breakdown_of_a_trained_model_is_fairseq_eval_lm_split_by_distance(lm_data, tmp_path):
    save = tmp_path / "ckpt"
    run_ok(
        "fairseq-train", lm_data, *TINY_LM_TRAIN, "--save-dir", save, "--max-update", "5", "--no-epoch-checkpoints",
        "--cluster-update-interval", "3", "--memory-size", "2000", "--kmeans-iters", "3", "--disable-validation",
    )  # fmt: skip
    path = save / "checkpoint_last.pt"
    flags = ["--tokens-per-sample", "200", "--context-window", "100"]
    out = run_ok("fairseq-clusterformer-longrange", lm_data, "--path", path, *flags, "--reach", "20",
                 "--json", tmp_path / "lr.json")  # fmt: skip
    result = json.loads((tmp_path / "lr.json").read_text())
    reference = run_ok("fairseq-eval-lm", lm_data, "--user-dir", PACKAGE, "--path", path, *flags,
                       "--batch-size", "4", "--num-workers", "0")  # fmt: skip
    loss = float(re.search(r"Loss \(base 2\): ([\d.]+)", reference).group(1))
    evaluated = int(re.search(r"Evaluated ([\d,]+) tokens", reference).group(1).replace(",", ""))
    # the same blocks as fairseq-eval-lm, so the same tokens and (for a strictly causal model) the same loss
    assert result["total"]["tokens"] == evaluated
    assert result["total"]["loss_base2"] == pytest.approx(loss, abs=6e-5)
    rows = result["buckets"]
    assert sum(r["tokens"] for r in rows.values()) == evaluated
    weighted = sum(r["tokens"] * r["loss_nats"] for r in rows.values() if r["tokens"]) / evaluated
    assert weighted == pytest.approx(result["total"]["loss_nats"], rel=1e-9)
    # tiny model: Cluster-Former layers 2 and 4; with --reach 20 many repeats of 200-token inputs are far
    assert rows["beyond reach"]["tokens"] > 100 and rows["within reach"]["tokens"] > 100
    assert [r["layer"] for r in result["mechanism"]["layers"]] == [2, 4]
    assert result["mechanism"]["far_tokens"] == rows["beyond reach"]["tokens"]
    assert "beyond reach" in out and "random keys" in out
    code, out = run_cli("fairseq-clusterformer-longrange", lm_data, "--path", path, "--context-window", "1024")
    assert code != 0 and "--context-window" in out
    # --score-tokens scores a prefix of exactly that many tokens
    prefix = run_ok("fairseq-clusterformer-longrange", lm_data, "--path", path, *flags, "--reach", "20",
                    "--score-tokens", "250", "--json", tmp_path / "prefix.json")  # fmt: skip
    assert json.loads((tmp_path / "prefix.json").read_text())["total"]["tokens"] == 250, prefix[-2000:]
    # fairseq's --max-tokens is a batch size: taken here it would quietly score a prefix, so it is refused by name
    code, out = run_cli("fairseq-clusterformer-longrange", lm_data, "--path", path, "--max-tokens", "8192")
    assert code != 0 and "--max-tokens" in out and "--score-tokens N" in out


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
