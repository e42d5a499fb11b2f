"""Checkpoint safety and set-ups that used to train silently wrong: each ends in an error naming the flag or file.

A typo in --restore-file, a flipped bit met by fairseq-train and every evaluation tool, debris of killed saves,
another --long-range-layers on resume, Cluster-Former layers trained by a task that never refreshes their centroids,
and a K-Means refresh that installed nothing being counted. (The checkpoint files themselves, flipped bits and
killed writes: test_checkpoint_integrity.py.)
"""

import logging
import os
import time

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_clusterformer.checkpoints.writes import FAIRSEQ_TEMP_IDLE_S
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.kinds import KINDS, NO_LONG_RANGE
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings
from tests.conftest import PACKAGE, REPO, TINY_LM_TRAIN, run_cli, run_ok
from tests.test_checkpoint_integrity import dead_pid, flip_bit, record_of

# ---- a skipped K-Means refresh is reported, not counted --------------------------------------------------------------


def test_a_refresh_with_too_few_banked_states_is_not_counted(caplog):
    torch.manual_seed(0)
    layer = ClusterFormerLayer(LayerSettings(8, 16, 2, 4, 2), 16).train()
    refresher = CentroidRefresher(RefreshSettings(memory_size=100, interval=2, iters=3, backend="torch"))
    refresher.attach(layer)
    centroids = layer.centroids.clone()
    with caplog.at_level(logging.INFO):
        for update in range(3):
            refresher.before_step(update)
            layer(torch.randn(1, 4, 8))  # 4 states per update: 8 in the bank at update 2, fewer than 16 clusters
            refresher.commit()
    assert torch.equal(layer.centroids, centroids)
    assert refresher.num_refreshes == 0 and refresher.summary() == {"num_refreshes": 0, "layer_refreshes": [0]}
    assert "8 banked states are fewer than the 16 clusters" in caplog.text
    assert "installed no centroids: not counted as a refresh" in caplog.text
    assert "K-Means refresh 1" not in caplog.text


# ---- training under a task that never refreshes the centroids --------------------------------------------------------


def build_under(lm_data, task_name, *extra):
    parser = options.get_training_parser()
    argv = [str(lm_data), "--user-dir", str(PACKAGE), "--task", task_name, "--arch", "clusterformer_lm_tiny"]
    args = options.parse_args_and_arch(parser, [*argv, "--tokens-per-sample", "200", *extra])
    cfg = convert_namespace_to_omegaconf(args)
    return tasks.setup_task(cfg.task).build_model(cfg.model)


def test_only_cluster_layers_need_the_clusterformer_task(lm_data):
    with pytest.raises(ValueError, match="--task clusterformer_lm"):
        build_under(lm_data, "language_modeling").train()
    build_under(lm_data, "language_modeling").eval()  # evaluation and generation: no refresh needed
    build_under(lm_data, "clusterformer_lm", "--memory-size", "1000").train()
    # no centroids, nothing to refresh: language_modeling trains it as clusterformer_lm would
    for kind in (NO_LONG_RANGE, *(name for name, row in KINDS.items() if not row.uses_clusters)):
        build_under(lm_data, "language_modeling", "--long-range-layer", kind).train()


# ---- through the real console scripts --------------------------------------------------------------------------------

TRAIN = [*TINY_LM_TRAIN, "--memory-size", "2000", "--no-epoch-checkpoints"]


@pytest.fixture(scope="module")
def run_dir(lm_data, tmp_path_factory):
    """A 2-update run whose save dir held the debris of a killed save when it started."""
    save = tmp_path_factory.mktemp("checkpoints_run")
    debris = [save / f"checkpoint_last.pt.tmp-{dead_pid()}-7", save / "checkpoint_1_2.pt.tmp"]
    for path in debris:
        path.write_bytes(b"x" * 4096)
    old = time.time() - FAIRSEQ_TEMP_IDLE_S - 60
    os.utime(debris[1], (old, old))
    out = run_ok("fairseq-train", lm_data, *TRAIN, "--max-update", "2", "--save-dir", save)
    return save, debris, out


@pytest.mark.e2e
def test_a_run_removes_debris_of_killed_saves_and_leaves_none(run_dir):
    save, debris, out = run_dir
    for path in debris:
        assert f"removed {path} (0.0 MiB), left by a killed checkpoint write" in out
    assert sorted(os.listdir(save)) == ["checkpoint_best.pt", "checkpoint_last.pt"]


def failure(*args):
    code, out = run_cli(*args)
    assert code != 0, out[-3000:]
    return out


@pytest.mark.e2e
def test_a_restore_file_typo_stops_before_the_run_is_overwritten(run_dir, lm_data, tmp_path):
    save, _, _ = run_dir
    before = {name: ((save / name).read_bytes(), (save / name).stat().st_mtime_ns) for name in os.listdir(save)}
    typo = save / "checkpoint_lats.pt"
    out = failure("fairseq-train", lm_data, *TRAIN, "--max-update", "4", "--save-dir", save, "--restore-file", typo)
    assert f"--restore-file {typo} does not exist" in out and f"--save-dir {save}" in out
    after = {name: ((save / name).read_bytes(), (save / name).stat().st_mtime_ns) for name in os.listdir(save)}
    assert after == before


@pytest.mark.e2e
def test_a_flipped_bit_stops_the_resume(run_dir, lm_data, tmp_path):
    last, flipped = run_dir[0] / "checkpoint_last.pt", tmp_path / "flipped.pt"
    tensor = "last_optimizer_state.state.3.exp_avg"
    record = record_of(last, tensor)
    flip_bit(last, flipped, record)
    resume = [*TRAIN, "--max-update", "4", "--save-dir", tmp_path / "s"]
    out = failure("fairseq-train", lm_data, *resume, "--restore-file", flipped)
    assert (
        f"--restore-file {flipped} is corrupted: record {record} (tensor last_optimizer_state.state.3.exp_avg)" in out
    )


OLD_QA = REPO / "tests" / "data" / "old_checkpoints" / "qa"
EVAL_LM = ["--tokens-per-sample", "200", "--batch-size", "4", "--num-workers", "0", "--cpu"]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "tool, args, flag",
    [
        ("fairseq-eval-lm", ["--user-dir", PACKAGE, *EVAL_LM], "--path"),  # the README's command: no --task
        ("fairseq-clusterformer-causal-eval", EVAL_LM, "--path"),
        (
            "fairseq-clusterformer-longrange",
            [*EVAL_LM[:2], "--context-window", "100", "--reach", "20", "--cpu"],
            "--path",
        ),
        ("fairseq-train", [*TRAIN, "--max-update", "1"], "--finetune-from-model"),
        ("fairseq-clusterformer-qa-predict", ["--split", "valid", "--cpu"], "--path"),
    ],
)
def test_a_flipped_weight_stops_every_load_path(run_dir, lm_data, tmp_path, tool, args, flag):
    """Eight flipped bytes in a weight are caught wherever a checkpoint is loaded, not only where the plug-in's task
    loads it: before, plain fairseq-eval-lm printed a perplexity of 1159.44 instead of 1158.46, exit 0."""
    qa = tool.endswith("qa-predict")
    source = OLD_QA / "checkpoint.pt" if qa else run_dir[0] / "checkpoint_last.pt"
    tensor = "model.qa_heads.span.weight" if qa else "model.decoder.embed_tokens.weight"
    flipped = tmp_path / "flipped.pt"
    record = record_of(source, tensor)
    flip_bit(source, flipped, record, count=8)
    data = OLD_QA / "bin" if qa else lm_data
    where = (
        ["--save-dir", tmp_path / "s"] if tool == "fairseq-train" else ["--output", tmp_path / "p.json"] if qa else []
    )
    out = failure(tool, data, *args, *where, flag, flipped)
    assert f"{flag} {flipped} is corrupted: record {record} (tensor {tensor})" in out.strip().splitlines()[-1]
    assert not list(tmp_path.glob("s/*.pt")) and not (tmp_path / "p.json").exists()


@pytest.mark.e2e
def test_a_resume_that_does_not_fit_says_which_layers_differ(run_dir, lm_data, tmp_path):
    last = run_dir[0] / "checkpoint_last.pt"
    resume = [*TRAIN, "--max-update", "4", "--save-dir", tmp_path / "s"]
    out = failure("fairseq-train", lm_data, *resume, "--restore-file", last, "--long-range-layers", "2,3")
    assert f"--restore-file {last} has Cluster-Former layers [2, 4]" in out
    assert "(trained with --long-range-layers 2,4 --long-range-layer cluster)" in out
    assert "but --long-range-layers 2,3 --long-range-layer cluster build Cluster-Former layers [2, 3]" in out
    # a checkpoint of a model without centroid buffers (as --long-range-layer none writes)
    state = torch.load(last, weights_only=False)
    state["model"] = {k: v for k, v in state["model"].items() if not k.endswith(("centroids", "shares", "refreshes"))}
    bare = tmp_path / "bare.pt"
    torch.save(state, bare)
    out = failure("fairseq-train", lm_data, *resume, "--restore-file", bare)
    assert f"--restore-file {bare} has no K-Means centroid buffers" in out and "Cluster-Former layers [2, 4]" in out


@pytest.mark.e2e
@pytest.mark.parametrize(
    "flags, trained, given",
    [
        (
            ["--window-size", "32", "--window-stride", "16"],
            "--window-size 64 --window-stride 32 --cluster-groups 2",
            "--window-size 32 --window-stride 16 --cluster-groups 3",
        ),
        (["--cluster-causality", "paper"], "--cluster-causality strict", "--cluster-causality paper"),
        (["--long-range-values", "next"], "--long-range-values own", "--long-range-values next"),
    ],
)
def test_a_resume_with_other_computing_settings_names_both_values(run_dir, lm_data, tmp_path, flags, trained, given):
    """Same shapes, so fairseq would load the weights and train on as another model; the run stops naming the flags,
    with the checkpoint's values and the command line's (the default --cluster-groups follows the window)."""
    save = run_dir[0]
    before = {name: (save / name).read_bytes() for name in os.listdir(save)}
    resume = [*TRAIN, "--max-update", "4", "--save-dir", tmp_path / "s", "--restore-file", save / "checkpoint_last.pt"]
    out = failure("fairseq-train", lm_data, *resume, *flags)
    last = out.strip().splitlines()[-1]
    assert f"--restore-file {save / 'checkpoint_last.pt'} was trained with {trained}" in last
    assert f"but the command line gives {given}" in last
    assert {name: (save / name).read_bytes() for name in os.listdir(save)} == before


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--long-range-layers", "2,4,2"], "--long-range-layers '2,4,2' names layer(s) [2] more than once"),
        (["--cluster-groups", "17"], "--cluster-groups 17 must not exceed --num-clusters (16)"),
        (["--long-range-layers", ""], "--long-range-layers is empty, so no layer would run --long-range-layer cluster"),
    ],
)
def test_long_range_flags_that_built_another_model_are_refused(lm_data, flags, message):
    with pytest.raises(ValueError) as error:
        build_under(lm_data, "clusterformer_lm", *flags)
    assert message in str(error.value)
    build_under(lm_data, "clusterformer_lm", "--long-range-layers", "", "--long-range-layer", "none")


@pytest.mark.e2e
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--long-range-layers", ""], "--long-range-layers is empty, so no layer would run --long-range-layer cluster"),
        (["--task", "language_modeling"], "Train with --task clusterformer_lm"),
    ],
)
def test_silently_wrong_set_ups_are_refused_by_fairseq_train(lm_data, tmp_path, flags, message):
    train = TRAIN
    if "language_modeling" in flags:  # fairseq's task, which has no memory-bank flags
        train = [arg for arg in TRAIN if arg not in ("--task", "clusterformer_lm", "--memory-size", "2000")]
    out = failure("fairseq-train", lm_data, *train, *flags, "--max-update", "2", "--save-dir", tmp_path / "s")
    assert message in out
    assert not (tmp_path / "s" / "checkpoint_last.pt").exists()


@pytest.mark.e2e
def test_plain_fairseq_eval_lm_still_evaluates_a_trained_checkpoint(run_dir, lm_data):
    eval_args = ["--user-dir", PACKAGE, "--gen-subset", "test", "--tokens-per-sample", "200", "--batch-size", "4"]
    out = run_ok("fairseq-eval-lm", lm_data, *eval_args, "--path", run_dir[0] / "checkpoint_last.pt")
    assert "Perplexity" in out
