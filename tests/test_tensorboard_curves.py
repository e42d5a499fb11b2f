"""--tensorboard-logdir carries the plug-in's scalars (cluster entropy, K-Means refreshes, bank fill; EM / F1 of a QA
validation) into TensorBoard's event files, through the real fairseq-train, and examples/tensorboard_curves.py draws
them (the picture in docs/usage.md was drawn so)."""

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, TINY_LM_TRAIN, run_ok, subprocess_env
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_end_to_end import TRAIN as QA_TRAIN

pytestmark = pytest.mark.e2e


def curves(logdir, out) -> str:
    proc = subprocess.run([sys.executable, REPO / "examples" / "tensorboard_curves.py", logdir, "--out", out],
                          capture_output=True, text=True, env=subprocess_env(), timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.stat().st_size > 10_000  # a PNG with curves, not an empty figure
    return proc.stdout


def test_the_language_models_scalars_reach_tensorboard_and_are_drawn(lm_data, tmp_path):
    logdir = tmp_path / "tb"
    run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, "--max-update", "20", "--cluster-update-interval", "8",
           "--memory-size", "1000", "--kmeans-iters", "3", "--log-format", "simple", "--log-interval", "4",
           "--no-save", "--save-dir", tmp_path / "ckpt", "--tensorboard-logdir", logdir)  # fmt: skip
    out = curves(logdir, tmp_path / "lm.png")
    for tag in ("loss", "cluster_entropy_0", "cluster_entropy_1", "bank_0", "bank_1"):
        assert f"{tag} (train_inner): " in out, out
    refreshes = re.search(r"kmeans_refreshes \(train_inner\): (\d+) at update 20", out)
    assert refreshes and int(refreshes.group(1)) >= 1, out  # a refresh started at update 8 installed 4 updates later


def test_a_qa_runs_em_and_f1_reach_tensorboard(tmp_path_factory, tmp_path):
    logdir = tmp_path / "tb"
    run_ok("fairseq-train", shared_data(tmp_path_factory), *QA_TRAIN, "--max-update", "6",
           "--validate-interval-updates", "3", "--no-save", "--save-dir", tmp_path / "ckpt",
           "--tensorboard-logdir", logdir)  # fmt: skip
    out = curves(logdir, tmp_path / "qa.png")
    assert re.search(r"^em \(valid\): [\d.]+ at update 6$", out, re.M) and "f1 (valid): " in out, out
