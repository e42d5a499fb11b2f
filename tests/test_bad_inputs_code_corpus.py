"""Bad input to the long-range comparison's tools, run for real: examples/code/prepare.sh (build_corpus.py) on a
folder too small for its splits, on one whose only file is skipped and on an unreadable file; examples/code/compare.sh
and examples/checkpoint_progress.py on a checkpoint that cannot be read; examples/compare.sh's --work in the forms its
parser takes. Each ends with a message naming the split, file, run or folder at fault and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.recipe_runs import recipe, snapshot, truncated_checkpoint

PROGRESS = REPO / "examples" / "checkpoint_progress.py"


def python_files(folder: Path, count: int) -> Path:
    folder.mkdir()
    for i in range(count):
        (folder / f"mod{i}.py").write_text(f"import os\n\n\ndef f{i}(x):\n    return os.path.join(x, '{i}')\n")
    return folder


def prepare_fails(tmp_path: Path, sources: Path) -> str:
    """examples/code/prepare.sh --data SOURCES, which must stop (status 1) before it writes anything."""
    before = snapshot(tmp_path)
    code, out = recipe("code/prepare.sh", "--data", sources, "--out", tmp_path / "work", cwd=tmp_path)
    assert code == 1, out[-3000:]
    assert snapshot(tmp_path) == before and "Traceback" not in out, out[-3000:]
    return out


def test_a_folder_too_small_for_the_splits_names_the_empty_ones(tmp_path):
    # 3 files: each file's hash picks its split, and none of these picks valid or test at 5 % each
    out = prepare_fails(tmp_path, python_files(tmp_path / "src", 3))
    assert f"--data {tmp_path / 'src'}: the valid and test splits would be empty: 3 usable files are too few" in out
    assert "valid 5 %, test 5 %" in out and "--valid-percent" in out


def test_a_folder_whose_only_file_is_skipped_says_so_and_why(tmp_path):
    sources = tmp_path / "src"
    sources.mkdir()
    (sources / "only.py").write_text("def f(:\n    '''never closed\n")
    out = prepare_fails(tmp_path, sources)
    assert f"--data {sources}: none of its 1 .py files can be used: 1 skipped (not tokenizable as Python" in out
    assert "data:only.py (" in out and "percent" not in out


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc/self/mem")
def test_an_unreadable_file_is_named(tmp_path):
    sources = python_files(tmp_path / "src", 30)
    # reading /proc/self/mem from offset 0 fails with EIO, for root too, and Python's OSError then names no file
    (sources / "unreadable.py").symlink_to("/proc/self/mem")
    out = prepare_fails(tmp_path, sources)
    assert f"build_corpus.py: cannot read {sources / 'unreadable.py'}: [Errno 5]" in out


def progress(path: Path, *expect: str) -> subprocess.CompletedProcess:
    flags = [arg for pair in expect for arg in ("--expect", pair)]
    return subprocess.run([sys.executable, str(PROGRESS), str(path), *flags], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_checkpoint_progress_reads_only_a_fairseq_checkpoint_or_nothing(tmp_path):
    assert progress(tmp_path / "fresh" / "checkpoint_last.pt").stdout == "0 0\n"  # a run not started yet
    (tmp_path / "run").mkdir()
    torch.save({"optimizer_history": [{"num_updates": 12}], "extra_state": {"previous_training_time": 1800}},
               tmp_path / "run" / "checkpoint_last.pt")  # fmt: skip
    assert progress(tmp_path / "run" / "checkpoint_last.pt").stdout == "12 0.5\n"
    folder = tmp_path / "folder" / "checkpoint_last.pt"
    folder.mkdir(parents=True)
    proc = progress(folder)
    assert proc.returncode == 2 and f"{folder}: is a folder, not a checkpoint" in proc.stderr
    truncated = truncated_checkpoint(tmp_path / "cut" / "checkpoint_last.pt")
    proc = progress(truncated)
    assert proc.returncode == 2 and f"{truncated}: cannot be read as a checkpoint (" in proc.stderr
    assert "truncated or corrupted?" in proc.stderr and "Traceback" not in proc.stderr
    torch.save({"model": {}}, tmp_path / "weights.pt")
    proc = progress(tmp_path / "weights.pt")
    assert proc.returncode == 2 and "is not a fairseq training checkpoint" in proc.stderr


@pytest.mark.parametrize("bad", ["truncated", "folder"])
def test_compare_names_the_run_whose_checkpoint_cannot_be_read_before_any_run(tmp_path, bad):
    work = tmp_path / "work"
    (work / "data-bin").mkdir(parents=True)
    (work / "data-bin" / "dict.txt").write_text("a 1\n")
    last = work / "ckpt" / "none-s2" / "checkpoint_last.pt"
    if bad == "truncated":
        truncated_checkpoint(last)
    else:
        last.mkdir(parents=True)
    before = snapshot(tmp_path)
    code, out = recipe("code/compare.sh", "--work", work, "none-s1", "none-s2", cwd=tmp_path, UPDATES="1")
    assert code == 2 and "compare.sh: none-s2: cannot tell how far it trained" in out, out[-3000:]
    assert f"{last}: " in out and "Traceback" not in out
    assert snapshot(tmp_path) == before  # none-s1, which comes first, was not trained either


@pytest.mark.e2e
def test_compare_lm_writes_where_work_says_in_every_form_its_parser_takes(tmp_path):
    # one row on a data folder without a dictionary: fairseq-train fails at once, and the table is still written
    # into the work folder, which shows which one was used
    (tmp_path / "no-dict").mkdir()
    row = ["--levels", "word", "--rows", "window", "--word-data-bin", "no-dict"]
    code, out = recipe("compare.sh", "--work=mine", "--preset", "tiny", *row, cwd=tmp_path, PYTHON=sys.executable)
    assert code == 1 and (tmp_path / "mine" / "results.md").is_file(), out[-3000:]
    code, out = recipe("compare.sh", "--pre", "tiny", *row, cwd=tmp_path, PYTHON=sys.executable)  # an abbreviation
    assert code == 1 and (tmp_path / "compare-work" / "tiny" / "results.md").is_file(), out[-3000:]
    assert sorted(p.name for p in (tmp_path / "compare-work").iterdir()) == ["tiny"]


@pytest.mark.parametrize(
    ("precision", "runs", "message"),
    [
        ("fp16", ("none-s1",), "PRECISION=fp16: expected fp32 or bf16"),
        ("bf16", ("none-s1", "full-s1"), "'full-s1' is fairseq's own transformer_lm"),
    ],
)
def test_compare_refuses_a_precision_it_cannot_train_before_any_run(tmp_path, precision, runs, message):
    work = tmp_path / "work"
    (work / "data-bin").mkdir(parents=True)
    (work / "data-bin" / "dict.txt").write_text("a 1\n")
    before = snapshot(tmp_path)
    code, out = recipe("code/compare.sh", "--work", work, *runs, cwd=tmp_path, UPDATES="1", PRECISION=precision)
    assert code == 2 and message in out, out[-3000:]
    assert snapshot(tmp_path) == before


def test_checkpoint_progress_refuses_a_checkpoint_trained_with_other_settings(tmp_path):
    """Another budget's run under the same folder name: resumed, it would go on under this call's schedule, and
    scored, pass for this call's run. --expect compares settings with the checkpoint's saved configuration (a
    dict as fairseq 0.12 saves it, a legacy (add_args) model's options a Namespace inside it, --lr a list of one)."""
    from argparse import Namespace

    cfg = {"common": {"seed": 1}, "optimization": {"max_update": 1400, "lr": [1e-4]},
           "lr_scheduler": {"warmup_updates": 140, "lr": [1e-4]},
           "model": Namespace(num_clusters=64, attention_dropout=0.0, max_update=1400)}  # fmt: skip
    path = tmp_path / "run" / "checkpoint_last.pt"
    path.parent.mkdir()
    torch.save({"optimizer_history": [{"num_updates": 300}], "extra_state": {"previous_training_time": 900},
                "cfg": cfg}, path)  # fmt: skip
    same = progress(path, "max_update=1400", "lr=1e-4", "seed=1", "num_clusters=64", "attention_dropout=0")
    assert same.returncode == 0 and same.stdout == "300 0.25\n", same.stderr
    other = progress(path, "max_update=800", "lr=1e-4", "warmup_updates=80")
    assert other.returncode == 2 and other.stdout == "", other.stderr
    assert f"{path}: was trained with other settings: max_update 1400 (this call: 800); warmup_updates 140 (this " in (
        other.stderr
    )
    unknown = progress(path, "max_updates=1400")
    assert unknown.returncode == 2 and "has no setting max_updates" in unknown.stderr
    assert progress(tmp_path / "new" / "checkpoint_last.pt", "max_update=800").stdout == "0 0\n"  # nothing to check
