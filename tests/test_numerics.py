"""Mixed precision and numerical guards: bf16 layers, masks, float32 cluster assignment, NaN states, degenerate banks.

B = batch, T = tokens, C = channels.
"""

import logging

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.ops.attention import masked_attention
from fairseq_clusterformer.ops.clustering import assign_clusters
from fairseq_clusterformer.ops.masks import band_mask, window_mask
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings
from tests.conftest import PACKAGE

C = 16


def cluster_layer(causality="strict", clusters=4):
    torch.manual_seed(0)
    layer = ClusterFormerLayer(LayerSettings(C, 32, 2, 6, 3), clusters, causality).eval()
    layer.set_centroids(torch.nn.functional.normalize(torch.randn(clusters, C), dim=-1))
    return layer


def test_masks_never_leave_a_row_fully_masked_even_when_every_key_is_a_pad():
    gen = torch.Generator().manual_seed(0)
    pos = torch.randperm(12, generator=gen).reshape(3, 4)  # 3 windows of 4 unique positions
    no_keys = torch.zeros(3, 4, dtype=torch.bool)
    for causal in (True, False):
        assert window_mask(pos, pos, no_keys, causal).any(dim=-1).all()
    ranks = torch.arange(4).expand(3, 4)
    ids = torch.randint(0, 3, (3, 4), generator=gen)
    assert band_mask(ranks, ranks, ids, ids, no_keys, reach=2).any(dim=-1).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_with_boolean_masks_is_finite_and_close_in_half_precision(dtype):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(5, 7, C, generator=gen) * 4 for _ in range(3))
    allowed = torch.rand(5, 7, 7, generator=gen) < 0.3
    allowed |= torch.eye(7, dtype=torch.bool)  # as the masks guarantee: a query sees itself
    full = masked_attention(q, k, v, allowed, heads=2)
    half = masked_attention(q.to(dtype), k.to(dtype), v.to(dtype), allowed, heads=2)
    assert half.dtype == dtype and torch.isfinite(half).all()
    torch.testing.assert_close(half.float(), full, atol=0.1, rtol=0.05)


def test_cluster_assignment_of_bf16_states_is_the_float32_cosine():
    gen = torch.Generator().manual_seed(2)
    centroids = torch.nn.functional.normalize(torch.randn(64, C, generator=gen), dim=-1)
    states = (torch.randn(4, 200, C, generator=gen) * 30).bfloat16()
    ids = assign_clusters(states, centroids.bfloat16())
    unit = torch.nn.functional.normalize
    expected = torch.matmul(unit(states.float(), dim=-1), unit(centroids.bfloat16().float(), dim=-1).t()).argmax(-1)
    assert torch.equal(ids, expected)
    # a bf16 cosine would put some states into other clusters: the float32 computation is what keeps them stable
    rough = torch.matmul(unit(states, dim=-1), unit(centroids.bfloat16(), dim=-1).t()).argmax(-1)
    assert not torch.equal(rough, expected)


@pytest.mark.parametrize("causality", ["strict", "paper"])
def test_bf16_cluster_layer_stays_finite_and_close_to_float32(causality):
    layer = cluster_layer(causality)
    x = torch.randn(2, 23, C, generator=torch.Generator().manual_seed(3))
    pads = torch.zeros(2, 23, dtype=torch.bool)
    pads[1, 15:] = True
    full = layer(x, pads)
    half = layer.bfloat16()(x.bfloat16(), pads)
    assert torch.isfinite(half).all()
    # same clusters (assignment in float32), so the outputs differ by bf16 rounding only
    torch.testing.assert_close(half.float()[~pads], full[~pads], atol=0.15, rtol=0.05)


def refresher_for(layer, **settings):
    refresher = CentroidRefresher(RefreshSettings(**{"memory_size": 400, "interval": 1, "iters": 5, **settings}))
    refresher.attach(layer)
    return refresher


def test_states_with_nan_or_inf_never_enter_the_bank_and_are_counted_and_logged(caplog):
    layer = cluster_layer().train()
    refresher = refresher_for(layer)
    x = torch.randn(2, 10, C)
    x[0, 3, 5] = float("nan")
    x[1, 7, 0] = float("inf")
    with caplog.at_level(logging.WARNING):
        layer(x)
        refresher.commit()
    bank = refresher.banks[0]
    assert len(bank) == 18 and torch.isfinite(bank.contents()).all()
    assert bank.num_nonfinite_dropped == 2
    assert "2 states with NaN/Inf kept out of the memory bank" in caplog.text


@pytest.mark.parametrize("distinct", [1, 3])
def test_kmeans_on_a_degenerate_bank_keeps_the_old_centroids_and_warns(distinct, caplog):
    layer = cluster_layer(clusters=4).train()
    refresher = refresher_for(layer)
    directions = torch.randn(distinct, C, generator=torch.Generator().manual_seed(4))
    layer(directions.repeat(40, 1).unsqueeze(0))  # 40 * distinct states, only `distinct` directions
    refresher.commit()
    before, counted = layer.centroids.clone(), refresher.layer_refreshes  # the layer's own count: 1 (set by hand)
    with caplog.at_level(logging.WARNING):
        refresher.before_step(1)
    assert torch.equal(layer.centroids, before)
    assert "fewer than 4 distinct directions; keeping the previous centroids" in caplog.text
    assert refresher.layer_refreshes == counted == [1]


def test_kmeans_on_a_healthy_bank_does_replace_the_centroids():
    layer = cluster_layer(clusters=4).train()
    refresher = refresher_for(layer)
    layer(torch.randn(1, 120, C, generator=torch.Generator().manual_seed(5)))
    refresher.commit()
    before = layer.centroids.clone()
    refresher.before_step(1)
    # one more than the count the layer had (its centroids were set by hand once)
    assert not torch.equal(layer.centroids, before) and refresher.layer_refreshes == [2]


@pytest.mark.e2e
def test_bf16_model_trains_and_evaluates_through_the_task(lm_data):
    # fairseq-train cannot do this on CPU: fairseq 0.12's option parser turns --bf16 into --tpu (options.py), and
    # the trainer then asks torch_xla for a device. The same fairseq objects, driven here directly, train in bf16.
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            str(lm_data),
            "--user-dir",
            str(PACKAGE),
            "--task",
            "clusterformer_lm",
            "--arch",
            "clusterformer_lm_tiny",
            "--tokens-per-sample",
            "128",
            "--sample-break-mode",
            "none",
            "--memory-size",
            "500",
            "--kmeans-iters",
            "3",
            "--cluster-update-interval",
            "2",
            "--kmeans-swap-delay",
            "0",
            "--optimizer",
            "adam",
            "--lr",
            "0.003",
        ],
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model).to(torch.bfloat16)
    criterion = task.build_criterion(cfg.criterion)
    task.load_dataset("train")
    batches = task.get_batch_iterator(task.dataset("train"), max_sentences=4).next_epoch_itr(shuffle=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    losses = []
    for update, sample in zip(range(5), batches):
        model.train()
        loss, sample_size, _ = task.train_step(sample, model, criterion, _Step(optimizer), update)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss) / sample_size)
    assert task.refresher.layer_refreshes == [2, 2]  # refreshes at updates 2 and 4 on the bf16 states
    assert all(torch.isfinite(bank.contents()).all() for bank in task.refresher.banks)
    model.eval()
    with torch.no_grad():
        loss, sample_size, _ = task.valid_step(sample, model, criterion)
    assert torch.isfinite(loss) and float(loss) / sample_size < losses[0]


class _Step:
    """The optimizer interface task.train_step uses (backward only; the test steps the optimizer itself)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def backward(self, loss):
        loss.backward()
