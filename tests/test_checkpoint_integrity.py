"""Checkpoint files a fault cannot corrupt silently: every record's CRC-32 is checked before a load, so a flipped bit
is named by file, record and tensor; a kill half way through a copy or a save leaves the old checkpoint whole; the
temp files of killed writers are removed and those of live ones kept. (The same faults met by fairseq-train and the
evaluation tools: test_bad_inputs_checkpoints.py.)"""

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
from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from fairseq_clusterformer.checkpoints.integrity import verify_checkpoint
from fairseq_clusterformer.checkpoints.records import tensor_index, tensor_names
from fairseq_clusterformer.checkpoints.writes import FAIRSEQ_TEMP_IDLE_S, remove_stale_temp_files
from fairseq_clusterformer.compat.patches import install_patches

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
