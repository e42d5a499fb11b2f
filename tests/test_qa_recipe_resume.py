"""A QA run longer than one sitting, at the recipe's level: examples/qa/cpu_pretrained.sh stopped twice by MAX_HOURS
(after update 1, then after update 2, with a K-Means job started at update 2 and still to be installed) and resumed
by the same command to update 6 ends where the same command run without a stop ends: the same weights and centroids,
the same Adam moments, the same memory banks and refresh state, the same answers on the held-out article. Under
bfloat16 (``--autocast-bf16``), the precision of the budget series' runs."""

from __future__ import annotations

import json

import pytest
import torch

from tests.test_qa_pretrained_recipe import recipe, small_squad, tiny_bert

ENV = dict(KIND="cluster", LONG_RANGE_LAYERS="6", SEED="2", TRAIN_ARTICLES="2", UPDATES="6", BATCH="4", WINDOW="48",
           STRIDE="40", MAX_QUESTION="60", MAX_CONTEXT_TRAIN="256", CLUSTERS="4", KMEANS_INTERVAL="2", MEMORY="2000",
           THREADS="1", PRECISION="bf16", SAVE_INTERVAL="2")  # fmt: skip
# what differs between two runs of the same training by design: the clock, and the --stop-time-hours each call gives
TIMING = {"previous_training_time", "stop_time_hours", "seconds", "wall", "train_wall", "ups", "wps", "wpb", "bsz",
          "clip"}  # fmt: skip


def tensors(state, prefix: str = "") -> dict[str, object]:
    """Every leaf of a checkpoint's nested dicts and lists, by its path, without the timing entries."""
    if isinstance(state, dict):
        return {k: v for key, value in state.items() if key not in TIMING
                for k, v in tensors(value, f"{prefix}/{key}").items()}  # fmt: skip
    if isinstance(state, (list, tuple)):
        return {k: v for i, value in enumerate(state) for k, v in tensors(value, f"{prefix}/{i}").items()}
    return {prefix: state}


def assert_same_training_state(a: dict, b: dict) -> None:
    for part in ("model", "last_optimizer_state"):
        left, right = tensors(a[part]), tensors(b[part])
        assert left.keys() == right.keys(), part
        for key, value in left.items():
            if torch.is_tensor(value):
                assert torch.equal(value, right[key]), f"{part}{key} differs"
            else:
                assert value == right[key], f"{part}{key}: {value!r} != {right[key]!r}"
    left, right = tensors(a["extra_state"]), tensors(b["extra_state"])
    plug_in = [key for key in left if "bank" in key or "refresh" in key or "kmeans" in key.lower()]
    assert plug_in, sorted(left)  # the banks and the refresher's state are there to compare
    for key in plug_in + [k for k in left if "train_iterator" in k]:
        value = left[key]
        assert (torch.equal(value, right[key]) if torch.is_tensor(value) else value == right[key]), key


@pytest.mark.e2e
def test_a_stopped_and_resumed_run_ends_as_the_uninterrupted_run(tmp_path):
    src = tiny_bert(tmp_path)
    data, _ = small_squad(tmp_path)
    finished = {}
    for name, stops in (("straight", 0), ("resumed", 2)):
        out = tmp_path / name
        args = ("--hf", src, "--data", data, "--out", out, "--contexts", "article")
        for stop in range(1, stops + 1):
            proc = recipe(*args, timeout=600, MAX_HOURS="0.000001", **ENV)
            assert proc.returncode == 3 and f"at update {stop} of 6: not scored" in proc.stderr, proc.stderr[-3000:]
        proc = recipe(*args, timeout=600, MAX_HOURS="1", **ENV)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        finished[name] = out / "article_cluster-layer6-bf16-attdrop0_seed2"
    log = (tmp_path / "resumed" / "article_cluster-layer6-bf16-attdrop0_seed2.train.log").read_text()
    assert "K-Means job 1 started at update 2" in log and log.count("Stopping training due to cumulative") == 2
    straight, resumed = (torch.load(run / "checkpoint_last.pt", weights_only=False) for run in finished.values())
    assert straight["optimizer_history"][-1]["num_updates"] == resumed["optimizer_history"][-1]["num_updates"] == 6
    refreshes = [v for k, v in straight["model"].items() if k.endswith("refreshes")]
    assert refreshes and all(int(r) >= 1 for r in refreshes)  # the centroids compared are K-Means', not the initial
    assert_same_training_state(straight, resumed)
    answers = [json.loads((run / "valid.pred.json").read_text()) for run in finished.values()]
    assert answers[0] == answers[1]
