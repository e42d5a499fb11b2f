"""benchmarks/qa_cluster_ablation.py: the shuffled grouping keeps each sequence's group sizes and its pads, the
identity grouping makes the layer's sort the identity (its output is then the layer run on windows of the original
order), and the real script on a tiny trained Cluster-Former checkpoint: its trained pass answers as qa-predict does,
each ablation is scored against it question by question, and a checkpoint without long-range layers is refused."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
import torch

from fairseq_clusterformer.ops.clustering import stable_sort
from fairseq_clusterformer.ops.window_scheme import WindowScheme
from tests.conftest import REPO, run_ok
from tests.data.qa_model.synthetic import shared_data
from tests.layer_kinds import make
from tests.test_qa_reach import train


def ablation():
    return importlib.import_module("benchmarks.qa_cluster_ablation")


def sample_ids(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """B x T group ids in 0..4 with pads (at 5) at the end of some rows, and the padding mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 5, (3, 17), generator=g)
    lengths = torch.tensor([17, 11, 4])
    pad = torch.arange(17)[None] >= lengths[:, None]  # B x T
    return ids.masked_fill(pad, 5), pad


@pytest.mark.parametrize("seed", range(5))
def test_shuffle_keeps_group_sizes_and_pads_and_moves_tokens(seed):
    ids, pad = sample_ids(seed)
    out = ablation().shuffled_ids(ids, pad, torch.Generator().manual_seed(seed))
    assert torch.equal(out[pad], ids[pad])
    for b in range(ids.size(0)):
        assert torch.equal(out[b].sort().values, ids[b].sort().values)
    assert not torch.equal(out, ids)  # 17 and 11 tokens of 5 groups: some token changed group
    again = ablation().shuffled_ids(ids, pad, torch.Generator().manual_seed(seed))
    assert torch.equal(out, again)


def test_identity_grouping_sorts_nothing():
    ids, pad = sample_ids(0)
    grouped = ablation().identity_ids(ids, pad)
    _, order = stable_sort(grouped)
    assert torch.equal(order, torch.arange(17).expand(3, 17))
    assert torch.equal(grouped[pad], ids[pad]) and int(grouped[~pad].abs().sum()) == 0


@pytest.mark.parametrize("how", ["identity", "shuffled"])
def test_an_ablated_cluster_layer_runs_the_windows_of_its_new_order(how):
    """The ablation reaches the layer's forward: its output is the layer on windows of the order the ablated
    grouping gives (for the identity, the original order), not of the centroids' order."""
    layer = make("cluster-bidirectional", 16, 32, 2, 4, 2, 3).eval()
    x = torch.randn(2, 13, 16)
    module = ablation()
    trained = layer(x)
    module.ablate([layer], how, seed=3)
    ablated = layer(x)
    expected_ids = module.identity_ids(layer.cluster_ids(x, None), None) if how == "identity" else None
    if how == "shuffled":
        generator = torch.Generator().manual_seed(3)
        expected_ids = module.shuffled_ids(layer.cluster_ids(x, None), None, generator)
    _, order = stable_sort(expected_ids)
    scheme = WindowScheme(4, 2, 13)
    assert torch.allclose(ablated, layer.run_windows(x, scheme, None, order=order), atol=1e-6)
    assert not torch.allclose(ablated, trained, atol=1e-4)
    module.ablate([layer], "trained", seed=3)
    assert torch.allclose(layer(x), trained, atol=1e-6)


@pytest.mark.e2e
def test_script_scores_three_passes_of_a_trained_checkpoint(tmp_path_factory, tmp_path):
    qa_data = shared_data(tmp_path_factory)
    checkpoint = train(qa_data, tmp_path_factory, "cluster")
    script = [sys.executable, "-m", "benchmarks.qa_cluster_ablation", qa_data, "--cpu", "--max-examples", "20",
              "--batch-size", "3"]  # fmt: skip
    proc = subprocess.run([*script, "--path", checkpoint, "--json", tmp_path / "a.json"], capture_output=True,
                          text=True, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["questions"] == 20 and report["kinds"] == ["cluster"] and report["reference"] == "trained"
    out = tmp_path / "pred.json"
    run_ok("fairseq-clusterformer-qa-predict", qa_data, "--path", checkpoint, "--output", out, "--cpu")
    predicted = json.loads(out.read_text())
    assert report["answers"]["trained"] == {q: predicted[q] for q in report["answers"]["trained"]}
    for label in ("shuffled", "identity"):
        changed = sum(report["answers"][label][q] != a for q, a in report["answers"]["trained"].items())
        assert report["answers_changed"][label] == changed
        for metric in ("exact_match", "f1"):
            row = report[metric][label]
            assert row["difference"] == pytest.approx(row["mean"] - report[metric]["trained"]["mean"])
            assert row["interval"][0] <= row["difference"] <= row["interval"][1]
    none = train(qa_data, tmp_path_factory, "none")
    proc = subprocess.run([*script, "--path", none], capture_output=True, text=True)
    assert proc.returncode != 0 and f"--path {none}: no long-range layer to ablate" in proc.stderr
