"""The real fairseq-train and fairseq-eval-lm on real text, asserting on what they produce."""

import re

import pytest
import torch

from fairseq_clusterformer.ops.kmeans import greedy_order
from tests.conftest import PACKAGE, SLICE, TINY_LM_TRAIN, run_ok

pytestmark = pytest.mark.e2e

TRAIN = [
    *TINY_LM_TRAIN,
    "--log-format",
    "simple",
    "--log-interval",
    "5",
    "--seed",
    "3",
    "--memory-size",
    "3000",
    "--kmeans-iters",
    "10",
    "--no-epoch-checkpoints",
]


def centroids_of(path):
    state = torch.load(path, map_location="cpu", weights_only=False)["model"]
    return {k: v for k, v in state.items() if k.endswith("centroids")}


def perplexity(output):
    match = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", output)
    assert match, output[-2000:]
    return float(match.group(1)), float(match.group(2))


@pytest.fixture(scope="module")
def trained(lm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("ckpt")
    out = run_ok(
        "fairseq-train",
        lm_data,
        *TRAIN,
        "--save-dir",
        save,
        "--max-update",
        "40",
        "--cluster-update-interval",
        "10",
        "--save-interval-updates",
        "10",
        "--keep-interval-updates",
        "-1",
        "--cluster-causality",
        "paper",
    )
    return save, out


def test_training_refreshes_the_centroids_and_checkpoints_carry_them(trained):
    save, out = trained
    assert out.count("K-Means refresh") == 3 * 2, out[-3000:]  # after updates 10, 20, 30; two long-range layers
    assert "cluster_entropy_0" in out and "kmeans_refreshes=3" in out
    before = centroids_of(save / "checkpoint_1_10.pt")  # written before the first refresh
    after = centroids_of(save / "checkpoint_last.pt")
    assert sorted(after) == ["decoder.layers.1.centroids", "decoder.layers.3.centroids"]
    for key, centroids in after.items():
        assert centroids.shape == (16, 64)
        assert not torch.allclose(centroids, before[key]), f"{key} never changed"
        assert torch.allclose(centroids.norm(dim=-1), torch.ones(16), atol=1e-4)
        assert torch.equal(greedy_order(centroids), torch.arange(16)), "refreshed centroids are greedily ordered"
    losses = [float(x) for x in re.findall(r"train_inner .* loss=([\d.]+)", out)]
    assert losses[-1] < losses[0]


def test_eval_lm_reports_a_perplexity_far_below_chance(trained, lm_data):
    save, _ = trained
    vocab = sum(1 for _ in open(lm_data / "dict.txt")) + 4
    base2, ppl = perplexity(
        run_ok(
            "fairseq-eval-lm",
            lm_data,
            "--user-dir",
            PACKAGE,
            "--path",
            save / "checkpoint_best.pt",
            "--gen-subset",
            "test",
            "--tokens-per-sample",
            "200",
            "--context-window",
            "100",
            "--batch-size",
            "4",
            "--num-workers",
            "0",
        )
    )
    assert ppl == pytest.approx(2**base2, rel=1e-3)
    assert 1 < ppl < vocab / 5, f"perplexity {ppl} against a vocabulary of {vocab}"


def test_eval_lm_handles_segments_shorter_than_a_window_and_off_the_stride(trained, lm_data):
    save, _ = trained
    # 45 tokens: shorter than the 64-token window and not a multiple of the 32-token stride
    _, ppl = perplexity(
        run_ok(
            "fairseq-eval-lm",
            lm_data,
            "--user-dir",
            PACKAGE,
            "--path",
            save / "checkpoint_best.pt",
            "--gen-subset",
            "test",
            "--tokens-per-sample",
            "45",
            "--batch-size",
            "8",
            "--num-workers",
            "0",
            "--max-sentences",
            "8",
        )
    )
    assert 1 < ppl < float("inf")


def test_plain_eval_lm_says_when_a_checkpoint_predates_the_first_refresh(trained, lm_data):
    save, _ = trained
    common = ["--user-dir", PACKAGE, "--gen-subset", "test", "--tokens-per-sample", "200", "--num-workers", "0"]
    early = run_ok("fairseq-eval-lm", lm_data, "--path", save / "checkpoint_1_10.pt", *common, "--max-sentences", "4")
    assert early.count("never refreshed by K-Means") == 2, early[-3000:]  # both long-range layers
    assert perplexity(early)[1] > 1
    late = run_ok("fairseq-eval-lm", lm_data, "--path", save / "checkpoint_last.pt", *common, "--max-sentences", "4")
    assert "never refreshed" not in late


def test_eval_lm_scores_every_token_of_the_split(trained, lm_data):
    """fairseq-fixed drops a last batch smaller than --required-batch-size-multiple; the plug-in keeps it."""
    save, _ = trained
    expected = sum(len(line.split()) + 1 for line in open(SLICE / "test.txt", encoding="utf-8"))
    out = run_ok(
        "fairseq-eval-lm", lm_data, "--user-dir", PACKAGE, "--path", save / "checkpoint_best.pt",
        "--gen-subset", "test", "--tokens-per-sample", "200", "--batch-size", "4", "--num-workers", "0",
    )  # fmt: skip
    evaluated = re.search(r"Evaluated ([\d,]+) tokens", out)
    assert evaluated and int(evaluated.group(1).replace(",", "")) == expected, out[-2000:]
