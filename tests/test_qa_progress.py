"""benchmarks/qa_progress.py, run as a user runs it: the record of a run in progress (updates, the checkpoint's
SHA-256, the CPU and its product rates, the command) and the verdict a later session reads from it: continue the
recorded checkpoint or one the same run saved later, restart where the checkpoint is gone, finished at the planned
updates; a checkpoint behind the record, or with the recorded updates and other bytes, is refused."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import REPO, subprocess_env

COMMAND = "env KIND=cluster UPDATES=10 bash examples/qa/cpu_pretrained.sh --contexts article --out /x"


def save(run: Path, updates: int, weight: float = 0.0) -> Path:
    """A checkpoint_last.pt as fairseq writes one, with the fields the recipe reads."""
    run.mkdir(parents=True, exist_ok=True)
    state = {"optimizer_history": [{"num_updates": updates}], "model": {"w": torch.full((3,), weight)},
             "extra_state": {"previous_training_time": 360.0 * updates}}  # fmt: skip
    torch.save(state, run / "checkpoint_last.pt")
    return run / "checkpoint_last.pt"


def progress(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.qa_progress", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, env=subprocess_env(OMP_NUM_THREADS="1"), timeout=120)  # fmt: skip


def test_record_then_continue_restart_or_finish(tmp_path):
    run, record = tmp_path / "runs" / "article_cluster_seed1", tmp_path / "progress" / "run.json"
    checkpoint = save(run, 4)
    proc = progress("record", run, "--updates", 10, "--command", COMMAND, "--record", record)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(record.read_text())
    assert entry["updates_done"] == 4 and entry["updates_planned"] == 10 and entry["command"] == COMMAND
    assert entry["checkpoint_sha256"] == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert entry["checkpoint_bytes"] == checkpoint.stat().st_size and entry["hours_trained"] == 0.4
    assert entry["cpu"] and min(entry["matmul_gflops_one_thread"][k] for k in ("float32", "bfloat16")) > 0
    assert len(entry["code_commit"]) == 40 or entry["code_commit"] == "unknown"

    def verdict() -> str:
        proc = progress("check", run, "--record", record)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert verdict().startswith(f"continue: {checkpoint} at update 4 of 10 (recorded: 4)")
    save(run, 7)  # the run went on after the record was written: the same run, further on
    assert verdict().startswith("continue:") and "update 7 of 10" in verdict()
    save(run, 10)
    assert verdict().startswith("finished:")
    checkpoint.unlink()
    text = verdict()
    assert text.startswith(f"restart: {checkpoint} is not there") and "update 4" in text
    assert text.endswith("trains the run again from update 0")


def test_another_runs_checkpoint_is_refused(tmp_path):
    run, record = tmp_path / "run", tmp_path / "run.json"
    save(run, 4)
    assert progress("record", run, "--updates", 10, "--command", COMMAND, "--record", record).returncode == 0
    save(run, 4, weight=1.0)  # the recorded update, other weights
    proc = progress("check", run, "--record", record)
    assert proc.returncode == 2 and "update 4 as recorded, but other bytes" in proc.stderr
    save(run, 2)
    proc = progress("check", run, "--record", record)
    assert proc.returncode == 2 and "update 2, behind the record's 4" in proc.stderr


def test_bad_input_is_named(tmp_path):
    proc = progress("record", tmp_path / "none_yet", "--updates", 10, "--command", COMMAND, "--record", tmp_path / "r")
    assert proc.returncode == 2 and "no checkpoint to record" in proc.stderr and not (tmp_path / "r").exists()
    (tmp_path / "bad.json").write_text("{}")
    proc = progress("check", tmp_path, "--record", tmp_path / "bad.json")
    assert proc.returncode == 2 and f"--record {tmp_path / 'bad.json'}: not a progress record" in proc.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "checkpoint_last.pt").write_bytes(b"PK\x03\x04 cut short")
    proc = progress("record", broken, "--updates", 10, "--command", COMMAND, "--record", tmp_path / "r")
    assert proc.returncode == 2 and "cannot be read as a checkpoint" in proc.stderr
