"""fairseq's own model EMA (``--store-ema``) and deep copies of a model whose Cluster-Former layers feed memory banks.

fairseq's EMA deep-copies the model, then at every update averages its state towards the live model's: the integer
buffers (the dictionary hashes, the refresh counts) made the first update fail, and an averaged state loaded into the
copy dropped the decoder's final layer norm. The K-Means state (centroids, shares, refresh count) is not learned:
the EMA takes it from the live model as it is.
"""

import copy
import re

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings
from tests.conftest import PACKAGE, TINY_LM_TRAIN, run_cli, run_ok

SET_NOT_LEARNED = ("centroids", "shares", "refreshes", "dictionary_hashes")


def train_with_ema(lm_data, save, decay: str) -> str:
    code, out = run_cli(
        "fairseq-train", lm_data, *TINY_LM_TRAIN, "--save-dir", save, "--max-update", "12",
        "--cluster-update-interval", "4", "--memory-size", "1000", "--kmeans-iters", "5", "--seed", "3",
        "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "4",
        "--store-ema", "--ema-decay", decay,
    )  # fmt: skip
    assert code == 0, f"fairseq-train --store-ema failed ({code}):\n{out[-4000:]}"
    return out


def scored(lm_data, checkpoint) -> float:
    out = run_ok(
        "fairseq-eval-lm", lm_data, "--user-dir", PACKAGE, "--path", checkpoint, "--gen-subset", "valid",
        "--tokens-per-sample", "200", "--batch-size", "4", "--num-workers", "0",
    )  # fmt: skip
    match = re.search(r"Loss \(base 2\): ([\d.]+)", out)
    assert match, out[-2000:]
    return float(match.group(1))


def ema_checkpoint(save):
    """fairseq's own route to the EMA weights: a checkpoint whose model is the EMA."""
    checkpoint_utils.save_ema_as_checkpoint(str(save / "checkpoint_last.pt"), str(save / "ema.pt"))
    return save / "ema.pt"


@pytest.mark.e2e
def test_fairseq_train_with_store_ema_trains_and_its_ema_weights_score(lm_data, tmp_path):
    out = train_with_ema(lm_data, tmp_path, "0.9")
    assert "kmeans_refreshes=1" in out, out[-3000:]
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    live, ema = state["model"], state["extra_state"]["ema"]
    assert sorted(live) == sorted(ema), "the EMA model lost entries (the decoder's final layer norm)"
    for key in live:
        if key.rsplit(".", 1)[-1] in SET_NOT_LEARNED:
            assert torch.equal(live[key], ema[key]), f"{key}: set by K-Means / the dictionary, must not be averaged"
    assert int(ema["decoder.layers.1.refreshes"]) >= 1
    assert not torch.equal(live["decoder.embed_tokens.weight"], ema["decoder.embed_tokens.weight"]), "not averaged"
    vocab = sum(1 for _ in open(lm_data / "dict.txt")) + 4
    loss = scored(lm_data, ema_checkpoint(tmp_path))
    # between the untrained model (log2 of the vocabulary) and nowhere near a broken model's loss
    assert 1 < loss < torch.log2(torch.tensor(vocab)).item(), loss


@pytest.mark.e2e
def test_an_ema_of_decay_zero_scores_as_the_model_itself(lm_data, tmp_path):
    train_with_ema(lm_data, tmp_path, "0")
    assert scored(lm_data, ema_checkpoint(tmp_path)) == scored(lm_data, tmp_path / "checkpoint_last.pt")


def test_a_deep_copy_of_a_banked_model_trains_and_leaves_the_originals_bank_alone():
    torch.manual_seed(0)
    layer = ClusterFormerLayer(LayerSettings(8, 16, 2, 4, 2), 4).train()
    refresher = CentroidRefresher(RefreshSettings(memory_size=50, interval=3, iters=5, backend="torch", seed=7))
    refresher.attach(layer)
    twin = copy.deepcopy(layer)
    states = torch.randn(2, 20, 8)
    twin(states, None).sum().backward()  # the copied pre-hook stages into the copy's banks
    refresher.commit()
    assert len(refresher.banks[0]) == 0, "the copy's forward fed the original's bank"
    layer(states, None)
    refresher.commit()
    assert len(refresher.banks[0]) == 40


@pytest.mark.e2e
def test_store_ema_added_on_resume_starts_the_ema_from_the_checkpoints_weights(lm_data, tmp_path):
    common = [*TINY_LM_TRAIN, "--save-dir", tmp_path, "--memory-size", "1000", "--seed", "3", "--no-epoch-checkpoints"]
    run_ok("fairseq-train", lm_data, *common, "--max-update", "2")
    out = run_ok("fairseq-train", lm_data, *common, "--max-update", "4", "--store-ema", "--ema-decay", "0.9")
    assert f"--store-ema: {tmp_path / 'checkpoint_last.pt'} was saved without an EMA" in out, out[-3000:]
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 4
    assert sorted(state["extra_state"]["ema"]) == sorted(state["model"])
