"""Bad files and flags end in an error that names the file (or flag) at fault, never a bare library error."""

from argparse import Namespace

import pytest
import torch

from fairseq_clusterformer.checkpoints.integrity import verify_checkpoint
from fairseq_clusterformer.layers.baselines import LSHLayer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.kinds import LongRangePlan
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.refresh.refresher import RefreshSettings
from fairseq_clusterformer.refresh.task_hooks import refresh_settings
from tests.conftest import PACKAGE, SLICE, TINY_LM_TRAIN, run_cli, run_ok
from tests.test_model import build


def test_truncated_or_foreign_checkpoint_files_are_named(tmp_path):
    whole = tmp_path / "whole.pt"
    torch.save({"model": {"w": torch.randn(300, 300)}}, whole)
    verify_checkpoint(str(whole), "--path")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ValueError, match=f"--restore-file {truncated} is not a complete PyTorch checkpoint"):
        verify_checkpoint(str(truncated), "--restore-file")
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="truncated or corrupted"):
        verify_checkpoint(str(text), "--path")
    legacy = tmp_path / "legacy.pt"  # torch < 1.6 format, as fairseq's older published checkpoints
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    verify_checkpoint(str(legacy), "--path")


LAYER = LayerSettings(8, 16, 2, 4, 2)
BAD_SETTINGS = {
    "--window-stride": lambda: LayerSettings(8, 16, 2, 4, 4),
    "--window-size": lambda: LayerSettings(8, 16, 2, 0, 1),
    "--window-merge": lambda: LayerSettings(8, 16, 2, 4, 2, window_merge="token"),
    "--sliding-windows": lambda: LayerSettings(8, 16, 2, 4, 2, sliding_windows="dilated"),
    "--long-range-values": lambda: LongRangePlan(frozenset({1}), values="previous"),
    "--decoder-attention-heads": lambda: LayerSettings(8, 16, 3, 4, 2),
    "--long-range-layer": lambda: LongRangePlan(frozenset({1}), "kmeans"),
    "--cluster-causality": lambda: LongRangePlan(frozenset({1}), causality="future"),
    "--num-clusters": lambda: LongRangePlan(frozenset({1}), "lsh", 15),
    "--cluster-groups": lambda: LongRangePlan(frozenset({1}), band_groups=0),
    "--memory-size": lambda: RefreshSettings(memory_size=0),
    "--kmeans-iters": lambda: RefreshSettings(iters=0),
    "--cluster-update-interval": lambda: RefreshSettings(interval=-1),
    "--memory-sample-per-batch": lambda: RefreshSettings(sample_per_batch=-2),
    "--kmeans-swap-delay": lambda: RefreshSettings(swap_delay=-1),
    "--kmeans-backend": lambda: RefreshSettings(backend="kmcuda"),
}


@pytest.mark.parametrize("flag", BAD_SETTINGS)
def test_every_bad_setting_names_its_flag(flag):
    with pytest.raises(ValueError, match=flag):
        BAD_SETTINGS[flag]()


def test_a_layer_built_on_its_own_is_checked_like_a_model_plan():
    ClusterFormerLayer(LAYER, 4, "paper", 3)  # good values pass
    with pytest.raises(ValueError, match="--cluster-causality"):
        ClusterFormerLayer(LAYER, 4, "future")
    with pytest.raises(ValueError, match="--cluster-groups"):
        ClusterFormerLayer(LAYER, 4, "strict", 0)
    with pytest.raises(ValueError, match="--num-clusters"):
        LSHLayer(LAYER, 5)


def test_the_task_flags_are_checked_by_the_refresh_settings():
    flags = {"memory_size": 100, "cluster_update_interval": 0, "kmeans_iters": 5, "memory_sample_per_batch": 0}
    good = Namespace(**flags, kmeans_backend="torch", seed=1, kmeans_swap_delay=0)
    assert refresh_settings(good).memory_size == 100
    with pytest.raises(ValueError, match="--kmeans-swap-delay must be >= 0, got -3"):
        refresh_settings(Namespace(**{**vars(good), "kmeans_swap_delay": -3}))


TRAIN = [*TINY_LM_TRAIN, "--memory-size", "2000", "--no-epoch-checkpoints"]
EVAL = ["--user-dir", PACKAGE, "--gen-subset", "test", "--tokens-per-sample", "200", "--batch-size", "4"]


@pytest.fixture(scope="module")
def checkpoint(lm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("bad_inputs_ckpt")
    run_ok("fairseq-train", lm_data, *TRAIN, "--max-update", "2", "--save-dir", save)
    return save / "checkpoint_last.pt"


def failure(*args):
    code, out = run_cli(*args)
    assert code != 0, out[-3000:]
    return out


@pytest.mark.e2e
def test_truncated_checkpoint(checkpoint, lm_data, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(checkpoint.read_bytes()[:50_000])
    out = failure(
        "fairseq-train", lm_data, *TRAIN, "--max-update", "4", "--save-dir", tmp_path / "s", "--restore-file", truncated
    )
    assert f"--restore-file {truncated} is not a complete PyTorch checkpoint" in out
    # plain fairseq-eval-lm loads the file before any task of ours exists: only fairseq's log line names it (torch's
    # error itself can be a bare "OSError: [Errno 22] Invalid argument"); with --task clusterformer_lm ours does
    out = failure("fairseq-eval-lm", lm_data, *EVAL, "--path", truncated)
    assert f"loading model(s) from {truncated}" in out
    out = failure("fairseq-eval-lm", lm_data, *EVAL, "--task", "clusterformer_lm", "--path", truncated)
    assert f"--path {truncated} is not a complete PyTorch checkpoint" in out


@pytest.mark.e2e
def test_data_directory_without_a_split(checkpoint, lm_data, tmp_path):
    partial = tmp_path / "data-bin"
    partial.mkdir()
    for name in ("dict.txt", "train.bin", "train.idx"):
        (partial / name).write_bytes((lm_data / name).read_bytes())
    out = failure("fairseq-train", partial, *TRAIN, "--max-update", "2", "--save-dir", tmp_path / "s")
    assert f"Dataset not found: valid ({partial}/valid)" in out  # fairseq's own message names split and path
    out = failure("fairseq-eval-lm", partial, *EVAL, "--path", checkpoint)
    assert f"Dataset not found: test ({partial}/test)" in out


@pytest.mark.e2e
def test_checkpoint_trained_with_another_dictionary(checkpoint, tmp_path):
    other = tmp_path / "other-bin"  # the valid text alone: a smaller dictionary
    run_ok(
        "fairseq-preprocess",
        "--only-source",
        "--trainpref",
        SLICE / "valid.txt",
        "--validpref",
        SLICE / "valid.txt",
        "--testpref",
        SLICE / "test.txt",
        "--destdir",
        other,
        "--workers",
        "1",
    )
    out = failure("fairseq-eval-lm", other, *EVAL, "--task", "clusterformer_lm", "--path", checkpoint)
    assert "the checkpoint was trained with another dictionary" in out and f"{other}/dict.txt" in out
    # resuming training on it: refused before fairseq loads the weights, so the last line is ours (fairseq's own
    # "Cannot load model parameters ... ensure that the architectures match" no longer hides it), naming flag and file
    out = failure(
        "fairseq-train", other, *TRAIN, "--max-update", "4", "--save-dir", tmp_path / "s", "--restore-file", checkpoint
    )
    last = out.strip().splitlines()[-1]
    assert f"--restore-file {checkpoint} was trained with another dictionary than {other}/dict.txt" in last
    assert "Cannot load model parameters" not in out


# transformer_lm flags the windowed layers do not implement are refused
@pytest.mark.parametrize(
    "flag",
    ["--scale-attn", "--scale-fc", "--scale-heads", "--scale-resids", "--decoder-xformers-att-config"],
)
def test_normformer_and_xformers_flags_are_refused_by_name(lm_data, flag):
    value = ['{"name": "scaled_dot_product"}'] if flag == "--decoder-xformers-att-config" else []
    with pytest.raises(ValueError, match=f"{flag} is not supported by the clusterformer_lm model"):
        build(lm_data, flag, *value)
