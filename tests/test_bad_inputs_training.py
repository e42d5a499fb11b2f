"""Training runs that the user's own flags should not stop, run through the real fairseq-train: a derived
--cluster-groups default fits itself to --num-clusters (only an explicit value is refused)."""

from argparse import Namespace

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY

from fairseq_clusterformer.models.clusterformer_lm import band_groups
from tests.conftest import PACKAGE, run_cli, run_ok

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
