"""Sliding-window and Cluster-Former layers against slow loop references, and their causality."""

import pytest
import torch

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from tests.reference import (
    cluster_paper_reference,
    cluster_strict_reference,
    sliding_reference,
    token_output,
)

C = 16


def settings(size=6, stride=3, causal=True, normalize_before=True):
    return LayerSettings(C, 32, 2, size, stride, causal=causal, normalize_before=normalize_before)


def make(layer_cls, *args, **kw):
    torch.manual_seed(0)
    return layer_cls(*args, **kw).double().eval()


def run_on(device, layer, x):
    """The layer's output for x computed on ``device`` (``--device``), back on the CPU where the loop references run."""
    out = layer.to(device)(x.to(device)).cpu()
    layer.cpu()
    return out


def random_centroids(layer, clusters, seed=1):
    gen = torch.Generator().manual_seed(seed)
    layer.set_centroids(torch.nn.functional.normalize(torch.randn(clusters, C, generator=gen), dim=-1))


@pytest.mark.parametrize("length", [1, 5, 6, 17, 24])
@pytest.mark.parametrize("normalize_before", [True, False])
def test_sliding_window_layer_matches_loop_over_windows(length, normalize_before, device):
    layer = make(SlidingWindowLayer, settings(normalize_before=normalize_before))
    x = torch.randn(2, length, C, dtype=torch.float64)
    out = run_on(device, layer, x)
    for b in range(2):
        assert torch.allclose(out[b], sliding_reference(layer, x[b]), atol=1e-10)


@pytest.mark.parametrize("causality", ["paper", "strict"])
@pytest.mark.parametrize("length", [4, 19, 30])
def test_cluster_layer_matches_reference(causality, length, device):
    layer = make(ClusterFormerLayer, settings(), 4, causality)
    random_centroids(layer, 4)
    x = torch.randn(3, length, C, dtype=torch.float64)
    out = run_on(device, layer, x)
    reference = cluster_paper_reference if causality == "paper" else cluster_strict_reference
    for b in range(3):
        assert torch.allclose(out[b], reference(layer, x[b]), atol=1e-10)


def test_bidirectional_cluster_layer_matches_reference():
    layer = make(ClusterFormerLayer, settings(causal=False), 3, "strict")  # causality is moot without a mask
    random_centroids(layer, 3)
    x = torch.randn(2, 20, C, dtype=torch.float64)
    out = layer(x)
    for b in range(2):
        assert torch.allclose(out[b], cluster_paper_reference(layer, x[b], causal=False), atol=1e-10)


@pytest.mark.parametrize("causality", ["paper", "strict"])
def test_one_cluster_and_a_window_over_everything_is_dense_causal_attention(causality):
    length = 12
    layer = make(ClusterFormerLayer, settings(size=length + 1, stride=length), 1, causality)
    x = torch.randn(1, length, C, dtype=torch.float64)
    dense = torch.stack([token_output(layer, x[0], i, list(range(i + 1))) for i in range(length)])
    assert torch.allclose(layer(x)[0], dense, atol=1e-10)


def _future_changes_past(layer, x, t):
    changed = x.clone()
    changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :]) * 3
    return not torch.allclose(layer(x)[:, : t + 1], layer(changed)[:, : t + 1], atol=1e-12)


def test_strict_mode_is_strictly_causal(device):
    layer = make(ClusterFormerLayer, settings(), 4, "strict").to(device)
    for seed in range(20):
        random_centroids(layer, 4, seed)
        x = torch.randn(2, 25, C, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(device)
        for t in (0, 3, 11, 23):
            assert not _future_changes_past(layer, x, t), f"seed {seed}: future leaked into position <= {t}"


def test_paper_mode_can_leak_the_future_which_strict_mode_exists_to_stop():
    layer = make(ClusterFormerLayer, settings(), 4, "paper")
    leaks = 0
    for seed in range(20):
        random_centroids(layer, 4, seed)
        x = torch.randn(2, 25, C, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        leaks += _future_changes_past(layer, x, 11)
    assert leaks > 0


def test_sliding_window_layer_is_causal(device):
    layer = make(SlidingWindowLayer, settings()).to(device)
    x = torch.randn(2, 25, C, dtype=torch.float64, device=device)
    assert not any(_future_changes_past(layer, x, t) for t in (0, 7, 20))


@pytest.mark.parametrize("kind", ["sliding", "paper", "strict"])
def test_padding_never_changes_real_positions_nor_their_clusters(kind):
    if kind == "sliding":
        layer = make(SlidingWindowLayer, settings())
    else:
        layer = make(ClusterFormerLayer, settings(), 4, kind)
        random_centroids(layer, 4)
    x = torch.randn(1, 14, C, dtype=torch.float64)
    padded = torch.cat([x, torch.randn(1, 9, C, dtype=torch.float64) * 5], dim=1)
    mask = torch.zeros(1, 23, dtype=torch.bool)
    mask[:, 14:] = True
    assert torch.allclose(layer(x), layer(padded, mask)[:, :14], atol=1e-12)


def test_batch_rows_are_independent():
    layer = make(ClusterFormerLayer, settings(), 4, "paper")
    random_centroids(layer, 4)
    x = torch.randn(3, 20, C, dtype=torch.float64)
    alone = torch.cat([layer(x[b : b + 1]) for b in range(3)])
    assert torch.allclose(layer(x), alone, atol=1e-12)


@pytest.mark.parametrize("causality", ["paper", "strict"])
def test_gradients_match_finite_differences(causality):
    layer = make(ClusterFormerLayer, LayerSettings(4, 8, 2, 4, 2), 2, causality)
    random_centroids_small = torch.nn.functional.normalize(torch.randn(2, 4, dtype=torch.float64), dim=-1)
    layer.set_centroids(random_centroids_small)
    x = torch.randn(1, 9, 4, dtype=torch.float64, requires_grad=True)
    # the cluster assignment is piecewise constant in x; away from ties it is fixed under the tiny perturbation
    assert torch.autograd.gradcheck(lambda inp: layer(inp), (x,), eps=1e-6, atol=1e-5)
