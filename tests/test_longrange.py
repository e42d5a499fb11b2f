"""The long-range breakdown: bucket assignment and the mechanism statistic against brute-force loops, the chance of
a random hit, and the breakdown on a model trained by the real fairseq-train (the recall task: test_recall_task.py)."""

import itertools
import json
import re
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
from fairseq_clusterformer.scripts.longrange.longrange_tally import Tally
from tests.conftest import PACKAGE, TINY_LM_TRAIN, run_cli, run_ok

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
