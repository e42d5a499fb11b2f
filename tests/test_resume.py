"""Exact resume: the memory banks, the K-Means schedule and a refresh in flight survive a checkpoint."""

import inspect
import logging
import re

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings
from tests.conftest import PACKAGE, TINY_LM_TRAIN, run_ok

DIM, CLUSTERS = 8, 4


def make_refresher(delay: int, seed: int = 0):
    torch.manual_seed(seed)
    layer = ClusterFormerLayer(LayerSettings(DIM, 16, 2, 4, 2), CLUSTERS).train()
    refresher = CentroidRefresher(
        RefreshSettings(memory_size=50, sample_per_batch=7, interval=3, iters=5, backend="torch", swap_delay=delay)
    )
    refresher.attach(layer)
    return layer, refresher


def step(layer, refresher, update):
    refresher.before_step(update)
    layer(torch.randn(2, 6, DIM, generator=torch.Generator().manual_seed(update)) + update % 3)
    refresher.commit()


@pytest.mark.parametrize("delay", [0, 2])
def test_refresher_state_round_trip_resumes_exactly(delay):
    straight_layer, straight = make_refresher(delay)
    for update in range(10):
        step(straight_layer, straight, update)

    first_layer, first = make_refresher(delay)
    for update in range(7):  # update 6 starts a refresh that, with a delay, is still in flight at the save
        step(first_layer, first, update)
    state, centroids = first.state_dict(), first_layer.centroids.clone()
    if delay:
        assert state["pending"] is not None and state["pending"]["install_at"] == 8

    resumed_layer, resumed = make_refresher(delay, seed=99)  # other random initial centroids
    resumed_layer.set_centroids(centroids)  # what fairseq restores from the checkpoint's model
    resumed.load_state_dict(state)
    for update in range(7, 10):
        step(resumed_layer, resumed, update)

    assert torch.equal(resumed_layer.centroids, straight_layer.centroids)
    assert torch.equal(resumed.banks[0].contents(), straight.banks[0].contents())
    # refreshes start at updates 3, 6 and 9; with a delay of 2 the last one is still in flight at update 9
    assert resumed.num_refreshes == straight.num_refreshes == (3 if delay == 0 else 2)


def test_load_before_the_model_exists_is_applied_on_attach():
    layer, refresher = make_refresher(2)
    for update in range(5):
        step(layer, refresher, update)
    late = CentroidRefresher(refresher.settings)
    late.load_state_dict(refresher.state_dict())
    late.attach(ClusterFormerLayer(LayerSettings(DIM, 16, 2, 4, 2), CLUSTERS))
    assert late.restored and torch.equal(late.banks[0].contents(), refresher.banks[0].contents())


def test_resume_without_task_state_says_it_is_not_exact(caplog):
    _, refresher = make_refresher(0)
    with caplog.at_level(logging.WARNING):
        refresher.before_step(12)
    assert "not exact" in caplog.text


def test_resume_with_another_memory_size_names_the_flag():
    layer, refresher = make_refresher(0)
    step(layer, refresher, 0)
    other = CentroidRefresher(RefreshSettings(memory_size=60))
    other.attach(ClusterFormerLayer(LayerSettings(DIM, 16, 2, 4, 2), CLUSTERS))
    with pytest.raises(ValueError, match="--memory-size"):
        other.load_state_dict(refresher.state_dict())


TRAIN = [
    *TINY_LM_TRAIN,
    "--log-format",
    "simple",
    "--log-interval",
    "1",
    "--seed",
    "3",
    "--memory-size",
    "2000",
    "--memory-sample-per-batch",
    "300",
    "--kmeans-iters",
    "10",
    "--no-epoch-checkpoints",
    "--max-update",
    "8",
    "--save-interval-updates",
    "4",
    "--keep-interval-updates",
    "-1",
    "--cluster-update-interval",
    "3",
    "--kmeans-swap-delay",
    "2",
]


def losses(output):
    return {
        int(u): float(loss) for loss, u in re.findall(r"train_inner .*? loss=([\d.]+).*? num_updates=(\d+)", output)
    }


# fairseq 0.12.2 saves a task's state but never hands it back to a resumed training run; fairseq-fixed 0.12.3 and
# fairseq main do, through Task.get_checkpoint_dict / set_checkpoint_dict
HANDS_TASK_STATE_BACK = "set_checkpoint_dict" in inspect.getsource(checkpoint_utils.load_checkpoint)


@pytest.mark.e2e
@pytest.mark.skipif(not HANDS_TASK_STATE_BACK, reason="this fairseq does not restore task state on resume")
def test_fairseq_train_resumed_halfway_matches_a_straight_run(lm_data, tmp_path):
    straight = run_ok("fairseq-train", lm_data, *TRAIN, "--save-dir", tmp_path / "straight")
    half = tmp_path / "straight" / "checkpoint_1_4.pt"
    # only checkpoint_last.pt carries the memory banks: stop a run after update 4 and resume from its last checkpoint,
    # which holds a K-Means job started at update 3 that installs at update 5
    run_ok("fairseq-train", lm_data, *TRAIN, "--max-update", "4", "--save-dir", tmp_path / "resumed")
    resumed = run_ok("fairseq-train", lm_data, *TRAIN, "--save-dir", tmp_path / "resumed")
    assert "not exact" not in resumed and "checkpoint_last.pt (epoch 1 @ 4 updates)" in resumed

    expected, got = losses(straight), losses(resumed)
    assert sorted(got) == [5, 6, 7, 8], resumed[-3000:]
    assert {u: expected[u] for u in got} == got
    a = torch.load(tmp_path / "straight" / "checkpoint_1_8.pt", map_location="cpu", weights_only=False)
    b = torch.load(tmp_path / "resumed" / "checkpoint_1_8.pt", map_location="cpu", weights_only=False)
    different = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    assert not different, f"weights or centroids differ after resuming: {different}"
    last_a, last_b = (
        torch.load(tmp_path / run / "checkpoint_last.pt", weights_only=False) for run in ["straight", "resumed"]
    )
    banks_a = last_a["extra_state"]["ClusterFormerLMTask"]["centroid_refresh"]["banks"]
    banks_b = last_b["extra_state"]["ClusterFormerLMTask"]["centroid_refresh"]["banks"]
    assert len(banks_a) == 2
    for bank_a, bank_b in zip(banks_a, banks_b):
        assert torch.equal(bank_a["buffer"], bank_b["buffer"]) and bank_a["pos"] == bank_b["pos"]
    # refreshes start at updates 3 and 6: the first installs at 5, the second is still in flight at the end
    assert a["task_state"]["centroid_refresh"]["layer_refreshes"] == [1, 1]

    # the halfway checkpoint predates the first install: it evaluates, and the log says where its centroids come from
    out = run_ok(
        "fairseq-eval-lm",
        lm_data,
        "--task",
        "clusterformer_lm",
        "--user-dir",
        PACKAGE,
        "--path",
        half,
        "--gen-subset",
        "test",
        "--tokens-per-sample",
        "200",
        "--batch-size",
        "4",
        "--num-workers",
        "0",
    )
    assert "written before the first K-Means refresh" in out
    assert re.search(r"Perplexity: [\d.]+", out)
