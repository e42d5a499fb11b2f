"""Training runs that the user's own flags should not stop or clutter, run through the real fairseq-train: a derived
--cluster-groups default fits itself to --num-clusters (only an explicit value is refused), and a K-Means job still
in flight when training ends is reported, without logging errors, also where the host closed the log's stream
before the interpreter's exit hooks ran (as pytest does with its capture files)."""

import subprocess
import sys
from argparse import Namespace

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY

from fairseq_clusterformer.lm.model import band_groups
from tests.conftest import PACKAGE, TINY_LM_TRAIN, run_cli, run_ok, subprocess_env

# 1024 / (2 x 32) = 16 groups by the two-window rule, and only 8 clusters to cut them from
SHORT_WINDOWS = [
    "--user-dir", PACKAGE, "--task", "clusterformer_lm", "--arch", "clusterformer_lm_tiny",
    "--tokens-per-sample", "1024", "--window-size", "32", "--window-stride", "16", "--num-clusters", "8",
    "--sample-break-mode", "none", "--optimizer", "adam", "--lr", "0.003", "--batch-size", "2",
    "--num-workers", "0", "--memory-size", "2000",
]  # fmt: skip
CAPPED = "--cluster-groups 0 -> 8 (--tokens-per-sample 1024 / (2 x --window-size 32) = 16, capped at --num-clusters 8)"


@pytest.mark.e2e
def test_a_derived_cluster_groups_fits_num_clusters_and_an_explicit_one_is_refused(lm_data, tmp_path):
    save = tmp_path / "run"
    out = run_ok("fairseq-train", lm_data, *SHORT_WINDOWS, "--max-update", "1", "--no-epoch-checkpoints",
                 "--save-dir", save)  # fmt: skip
    assert CAPPED in out
    # the checkpoint keeps --cluster-groups 0: loading it derives the same 8 groups
    out = run_ok("fairseq-eval-lm", lm_data, "--path", save / "checkpoint_last.pt", "--user-dir", PACKAGE,
                 "--tokens-per-sample", "1024", "--batch-size", "2")  # fmt: skip
    assert CAPPED in out

    code, out = run_cli("fairseq-train", lm_data, *SHORT_WINDOWS, "--cluster-groups", "16", "--max-update", "1",
                        "--save-dir", tmp_path / "explicit")  # fmt: skip
    assert code != 0 and "--cluster-groups 16 must not exceed --num-clusters (8)" in out, out[-3000:]
    assert not (tmp_path / "explicit").exists() or not list((tmp_path / "explicit").iterdir())


@pytest.mark.parametrize("arch", ["clusterformer_lm_wiki103", "clusterformer_lm_enwik8", "clusterformer_lm_tiny"])
def test_the_presets_keep_their_group_counts_where_they_fitted(arch):
    for tokens in (64, 200, 512, 1024, 3072, 8192, 65536):
        args = Namespace(tokens_per_sample=tokens)
        ARCH_CONFIG_REGISTRY[arch](args)
        before = max(1, round(tokens / (2 * args.window_size)))  # the two-window rule, uncapped, as it was
        expected = before if before <= args.num_clusters else args.num_clusters  # refused before: now capped
        assert band_groups(args) == expected, (arch, tokens)


# fairseq-train's own main, in a process that first captures its output in a file and closes that file once training
# is done, before the interpreter's exit hooks run: what pytest does with every test that trains in its process
HOST_CLOSING_ITS_CAPTURE = """
import sys, tempfile, time

capture = tempfile.TemporaryFile("w+")
sys.stdout = sys.stderr = capture  # before fairseq is imported, which binds its log handler to sys.stderr
from fairseq_clusterformer.refresh import kmeans_job

if sys.argv[1] == "fail":
    def failing_refresh(*args):
        time.sleep(1.0)  # still running when training ends
        raise ValueError("faiss ran out of memory")
    kmeans_job.refresh_layer = failing_refresh
from fairseq_cli.train import cli_main

sys.argv = ["fairseq-train", *sys.argv[2:]]
cli_main()
capture.seek(0)
log = capture.read()
capture.close()
sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
print(log)
print("the host closed its capture", flush=True)
"""


@pytest.mark.e2e
@pytest.mark.parametrize("outcome", ["finished", "fail"])
def test_a_job_joined_after_the_log_was_closed_is_reported_without_logging_errors(lm_data, tmp_path, outcome):
    # a refresh starts at update 3 and would install at update 7: training stops at update 4 with it in flight
    schedule = ["--memory-size", "2000", "--cluster-update-interval", "3", "--kmeans-swap-delay", "4"]
    train = [lm_data, *TINY_LM_TRAIN, *schedule, "--max-update", "4", "--no-save"]
    proc = subprocess.run(
        [sys.executable, "-c", HOST_CLOSING_ITS_CAPTURE, outcome, *map(str, train)],
        cwd=tmp_path,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    assert "K-Means job 1 started at update 3" in out and "the host closed its capture" in out, out[-3000:]
    after = out.split("the host closed its capture", 1)[1]
    assert "Logging error" not in out and "closed file" not in out, after[-3000:]
    if outcome == "finished":
        assert "training ended with 1 K-Means job(s) not yet installed: joined them after the log was closed" in after
    else:
        assert "K-Means job 1 (snapshot of update 3) failed on its background thread" in after, after[-3000:]
        assert "ValueError: faiss ran out of memory" in after
