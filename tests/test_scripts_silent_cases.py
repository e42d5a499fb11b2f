"""No script ends silently or does the wrong thing without a word, run for real: examples/demo.sh with UPDATES=0 or
below its log interval; benchmarks/gpu_check/device_run.sh and benchmarks/qa_device/device_run.sh on a machine whose
torch sees no GPU, with a spent budget or without a payload; benchmarks/qa_device/prepare.sh with an encoder too
shallow for the device runs; the QA device driver's --kinds with a typo. Each refusal exits 2 (the driver: 1) naming
the variable, flag or folder, before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from benchmarks.qa_device.runs import KINDS
from tests.conftest import REPO, subprocess_env
from tests.hf_sources import make_bert
from tests.recipe_runs import recipe, snapshot

GPU_RUN = REPO / "benchmarks" / "gpu_check" / "device_run.sh"
QA_RUN = REPO / "benchmarks" / "qa_device" / "device_run.sh"
QA_RESULTS = REPO / "benchmarks" / "results" / "qa_pretrained" / "device"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the machine's torch sees a GPU")


def run(command: list, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    full_env = subprocess_env(OMP_NUM_THREADS="1", **env)
    return subprocess.run(list(map(str, command)), cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def refused(command: list, tmp_path: Path, watched: Path = QA_RESULTS, code: int = 2, **env) -> str:
    """The stderr of a command that must stop with status ``code``, having written nothing under ``tmp_path`` and
    ``watched`` (the committed QA device results: an untracked calls/ folder there was the symptom)."""
    before = snapshot(tmp_path), snapshot(watched)
    proc = run(command, tmp_path, **env)
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (snapshot(tmp_path), snapshot(watched)) == before, proc.stdout[-3000:]
    return proc.stderr


@pytest.mark.e2e
def test_demo_with_fewer_updates_than_its_log_interval_trains_and_evaluates(tmp_path):
    code, out = recipe("demo.sh", cwd=tmp_path, WORK=str(tmp_path / "work"), UPDATES="2")
    assert code == 0, out[-3000:]
    assert "update 2: train loss " in out and "Perplexity: " in out


@no_gpu
def test_gpu_check_refuses_a_machine_without_a_gpu_and_a_spent_budget(tmp_path):
    env = dict(OUT=str(tmp_path / "out"), PYTHON=sys.executable, SKIP_INSTALL="1")
    err = refused(["bash", GPU_RUN], tmp_path, GPU_BUDGET_MINUTES="0.1", **env)
    assert "torch sees no GPU here: this is the GPU's check" in err and 'GPU_CHECK_ARGS="--device cpu"' in err
    err = refused(["bash", GPU_RUN], tmp_path, GPU_BUDGET_MINUTES="0", **env)
    assert "GPU_BUDGET_MINUTES=0: every part would be skipped" in err


def test_a_cpu_dry_run_of_some_parts_adds_none_of_the_gpus_results(tmp_path):
    env = dict(OUT=str(tmp_path / "out"), PYTHON=sys.executable, SKIP_INSTALL="1", GPU_BUDGET_MINUTES="0")
    proc = run(["bash", GPU_RUN], tmp_path, GPU_CHECK_ARGS="--device cpu --parts tests", **env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(tmp_path / "out/gpu-check.tgz") as archive:
        summary = json.load(archive.extractfile("results/summary.json"))
    assert list(summary["parts"]) == ["tests"] and summary["parts"]["tests"]["status"] == "skipped"


def fake_payload(folder: Path) -> Path:
    folder.mkdir()
    (folder / "SHA256SUMS").write_text("")
    return folder


def test_the_qa_device_call_refuses_a_missing_payload_and_a_machine_without_a_gpu(tmp_path):
    env = dict(OUT=str(tmp_path / "out"), PYTHON=sys.executable, SKIP_INSTALL="1")
    err = refused(["bash", QA_RUN], tmp_path, PAYLOAD=str(tmp_path / "none"), **env)  # the committed RESULTS
    assert f"PAYLOAD={tmp_path / 'none'} holds no payload (no SHA256SUMS)" in err and "prepare.sh" in err
    if not torch.cuda.is_available():
        payload = fake_payload(tmp_path / "payload")
        err = refused(["bash", QA_RUN], tmp_path, PAYLOAD=str(payload), RESULTS=str(tmp_path / "results"), **env)
        assert "torch sees no GPU here: the QA device runs need one" in err and "QA_DEVICE_TINY=1" in err


def test_the_qa_device_driver_names_a_kind_it_does_not_know_before_it_makes_a_folder(tmp_path):
    payload = fake_payload(tmp_path / "payload")
    command = [sys.executable, "-m", "benchmarks.qa_device", "--payload", payload, "--work", tmp_path / "work",
               "--results", tmp_path / "results", "--stop-at", "0", "--kinds", "none,clustr"]  # fmt: skip
    err = refused(command, tmp_path, code=1)
    assert f"--kinds none,clustr: unknown kind clustr (the kinds: {', '.join(KINDS)})" in err
    assert "Traceback" not in err
    err = refused(command[:-2] + ["--seeds", "1,two"], tmp_path, code=1)
    assert "--seeds 1,two: expected whole numbers" in err


def test_qa_device_prepare_refuses_an_encoder_too_shallow_for_the_device_runs(tmp_path):
    hf = make_bert(tmp_path)  # 2 layers
    command = ["bash", REPO / "benchmarks/qa_device/prepare.sh", "--hf", hf, "--work", tmp_path / "work",
               "--out", tmp_path / "out", "--no-bundle", "--data", REPO / "examples/data/squad"]  # fmt: skip
    err = refused(command, tmp_path)
    assert f"--hf {hf}: an encoder of 2 layers; the device runs put their long-range layers at 5,6" in err
    assert "needs at least 6" in err


def test_qa_device_prepare_names_a_tracked_file_missing_from_the_tree_before_it_removes_anything(tmp_path):
    # a repository of the script, its helper and one tracked file deleted from the working tree, not committed
    repo = tmp_path / "repo"
    for name in ("benchmarks/qa_device/prepare.sh", "examples/recipe_args.sh"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text((REPO / name).read_text())
    (repo / "notes.txt").write_text("tracked\n")
    for git in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t"]):
        subprocess.run(["git", *git], cwd=repo, check=True)
    (repo / "notes.txt").unlink()
    out = repo / ".qa-device"
    (out / "encoder").mkdir(parents=True)
    (out / ".made-by-recipe").write_text("benchmarks/qa_device/prepare.sh\n")  # an earlier payload of the script
    (out / "encoder" / "model.pt").write_text("the previous payload")
    # refused: nothing under tmp_path changed, the previous payload kept
    err = refused(["bash", repo / "benchmarks/qa_device/prepare.sh", "--no-bundle"], tmp_path)
    assert "1 tracked file(s) missing from the working tree, which the device call carries: notes.txt" in err, err
