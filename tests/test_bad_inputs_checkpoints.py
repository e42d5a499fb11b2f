"""Checkpoint safety and set-ups that used to train silently wrong: each ends in an error naming the flag or file.

A typo in --restore-file, a flipped bit in a record, debris of killed saves, a copy killed half way, another
--long-range-layers on resume, Cluster-Former layers trained by a task that never refreshes their centroids, and a
K-Means refresh that installed nothing being counted.
"""

import logging
import os
import shutil
import struct
import subprocess
import sys
import time
import zipfile

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.file_io import PathManager

from fairseq_clusterformer.checkpoints.integrity import verify_checkpoint
from fairseq_clusterformer.checkpoints.records import tensor_index, tensor_names
from fairseq_clusterformer.checkpoints.writes import FAIRSEQ_TEMP_IDLE_S, remove_stale_temp_files
from fairseq_clusterformer.compat.patches import install_patches
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings
from tests.conftest import PACKAGE, REPO, TINY_LM_TRAIN, run_cli, run_ok

# ---- flipped bits: every record's CRC-32 is checked before a checkpoint is loaded ------------------------------------


def flip_bit(src, dst, record: str, count: int = 1) -> None:
    """Copy ``src`` to ``dst`` with one bit flipped in each of ``count`` bytes from the middle of the zip ``record``'s
    data on."""
    shutil.copyfile(src, dst)
    with zipfile.ZipFile(src) as archive:
        info = archive.getinfo(record)
    with open(dst, "r+b") as handle:
        handle.seek(info.header_offset + 26)  # a local header: 30 bytes, then the name and the extra field
        name_length, extra_length = struct.unpack("<HH", handle.read(4))
        position = info.header_offset + 30 + name_length + extra_length + info.file_size // 2
        handle.seek(position)
        data = handle.read(count)
        handle.seek(position)
        handle.write(bytes(byte ^ 0x08 for byte in data))


def record_of(path, tensor: str) -> str:
    key = next(key for key, where in tensor_names(tensor_index(str(path))).items() if where == tensor)
    with zipfile.ZipFile(path) as archive:
        return next(name for name in archive.namelist() if name.endswith(f"/data/{key}"))


@pytest.mark.parametrize("tensor", ["model.decoder.fc1.weight", "last_optimizer_state.state.0.exp_avg"])
def test_a_flipped_bit_names_the_file_the_record_and_the_tensor(tmp_path, tensor):
    whole = tmp_path / "whole.pt"
    state = {"model": {"decoder.fc1.weight": torch.randn(64, 64), "decoder.fc1.bias": torch.randn(64)}}
    state["last_optimizer_state"] = {"state": {0: {"exp_avg": torch.randn(64, 64)}}}
    torch.save(state, whole)
    verify_checkpoint(str(whole), "--path")
    flipped = tmp_path / "flipped.pt"
    record = record_of(whole, tensor)
    flip_bit(whole, flipped, record)
    assert zipfile.is_zipfile(flipped)  # the old check, which reads the zip's directory only, passed it
    with pytest.raises(
        ValueError, match=f"--restore-file {flipped} is corrupted: record {record} \\(tensor {tensor}\\)"
    ):
        verify_checkpoint(str(flipped), "--restore-file")


def test_a_flipped_bit_in_the_pickled_index_is_named(tmp_path):
    whole, flipped = tmp_path / "whole.pt", tmp_path / "flipped.pt"
    torch.save({"model": {"w": torch.ones(3)}, "note": "x" * 1000}, whole)
    flip_bit(whole, flipped, "whole/data.pkl")
    with pytest.raises(ValueError, match="record whole/data.pkl \\(the pickled index of the checkpoint\\)"):
        verify_checkpoint(str(flipped), "--path")


# ---- writes a kill cannot leave half done, and the debris of killed runs ---------------------------------------------


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temp_files_of_dead_writers_are_removed_and_live_ones_kept(tmp_path, caplog):
    old = time.time() - FAIRSEQ_TEMP_IDLE_S - 60
    files = {
        f".checkpoint_last.pt.tmp-{dead_pid()}-1": True,  # our temp file, its writer is gone
        f"checkpoint_last.pt.tmp-{dead_pid()}-5": True,  # the same from an earlier version (not hidden)
        f"checkpoint_best.pt.tmp-{os.getpid()}-2": True,  # a pid reused by this (new) run: written before it
        f"checkpoint_1_4.pt.tmp-{os.getppid()}-3": False,  # a live writer
        "checkpoint_1_8.pt.tmp": True,  # fairseq's own, idle for long
        "checkpoint_1_9.pt.tmp": False,  # fairseq's own, written just now
        f"notes.txt.tmp-{dead_pid()}-4": False,  # not a checkpoint's
        "checkpoint_last.pt": False,
    }
    for name in files:
        (tmp_path / name).write_bytes(b"x" * 1024)
    os.utime(tmp_path / "checkpoint_1_8.pt.tmp", (old, old))
    with caplog.at_level(logging.WARNING):
        removed = remove_stale_temp_files(str(tmp_path))
    assert sorted(os.path.basename(path) for path in removed) == sorted(name for name, gone in files.items() if gone)
    assert sorted(os.listdir(tmp_path)) == sorted(name for name, gone in files.items() if not gone)
    assert "left by a killed checkpoint write" in caplog.text and "a save may still be under way" in caplog.text


def test_a_copy_killed_half_way_leaves_the_old_checkpoint_whole(tmp_path, monkeypatch):
    install_patches()
    new, last = tmp_path / "checkpoint_1_8.pt", tmp_path / "checkpoint_last.pt"
    new.write_bytes(b"new" * 1000)
    last.write_bytes(b"old" * 1000)

    def copy_half_then_die(src, dst, **kwargs):
        with open(src, "rb") as source, open(dst, "wb") as target:
            target.write(source.read()[:1500])
        raise KeyboardInterrupt  # the kill

    monkeypatch.setattr(shutil, "copyfile", copy_half_then_die)
    with pytest.raises(KeyboardInterrupt):
        PathManager.copy(str(new), str(last), overwrite=True)  # what fairseq's save_checkpoint calls
    assert last.read_bytes() == b"old" * 1000
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_1_8.pt", "checkpoint_last.pt"]


def test_a_save_that_fails_leaves_the_old_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    install_patches()
    last = tmp_path / "checkpoint_last.pt"
    torch.save({"w": torch.zeros(2)}, last)
    before = last.read_bytes()

    def save_half_then_fail(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04 partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", save_half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        checkpoint_utils.torch_persistent_save({"w": torch.ones(2)}, str(last))  # what fairseq's trainer calls
    assert last.read_bytes() == before and os.listdir(tmp_path) == ["checkpoint_last.pt"]


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
    for kind in ("none", "lsh", "sparse"):
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
