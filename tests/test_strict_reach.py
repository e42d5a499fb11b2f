"""The strict mode's groups of neighbouring clusters: loop references in float64, the key count, the group cuts,
and strict causality of the whole model (embeddings, positions, every layer) for every long-range kind."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_clusterformer.layers.baselines import LSHLayer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.kinds import KINDS as LAYER_KINDS
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.ops.cluster_groups import band_group_ids, cluster_to_group, default_groups
from fairseq_clusterformer.refresh.kmeans_job import refresh_layer
from tests.reference import cluster_ids_reference, cluster_strict_reference, neighbour_strict_reference
from tests.test_model import build

C = 16


def make_cluster_layer(size, stride, clusters, groups, shares, heads=2, seed=0):
    torch.manual_seed(seed)
    layer_settings = LayerSettings(C, 32, heads, size, stride, causal=True, normalize_before=True)
    layer = ClusterFormerLayer(layer_settings, clusters, "strict", groups).double().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    layer.set_centroids(torch.nn.functional.normalize(torch.randn(clusters, C, generator=gen), dim=-1), shares)
    return layer


def skewed_shares(clusters, skew, seed):
    """Zipf-like shares in a random cluster order (skew 0 = equal shares)."""
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.randperm(clusters, generator=gen).double() + 1
    return (ranks**-skew / (ranks**-skew).sum()).float()


@settings(max_examples=30, deadline=None)
@given(
    length=st.integers(1, 40),
    size=st.integers(2, 8),
    stride_fraction=st.floats(0.1, 0.99),
    clusters=st.integers(2, 9),
    groups=st.integers(1, 4),
    skew=st.sampled_from([0.0, 1.0, 2.0]),
    heads=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 1000),
)
def test_cluster_strict_layer_equals_loop_over_tokens(
    length, size, stride_fraction, clusters, groups, skew, heads, seed
):
    stride = max(1, min(size - 1, int(size * stride_fraction)))
    groups = min(groups, clusters)  # more groups than clusters is refused (--cluster-groups), and would be empty
    layer = make_cluster_layer(size, stride, clusters, groups, skewed_shares(clusters, skew, seed), heads, seed)
    x = torch.randn(2, length, C, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    out = layer(x)
    for b in range(2):
        assert torch.allclose(out[b], cluster_strict_reference(layer, x[b]), atol=1e-10)


@pytest.mark.parametrize("length", [7, 33])
def test_lsh_strict_layer_equals_loop_over_tokens_with_groups_of_buckets(length):
    torch.manual_seed(0)
    layer = LSHLayer(LayerSettings(C, 32, 2, 6, 3), 8, "strict", 3).double().eval()
    x = torch.randn(2, length, C, dtype=torch.float64)
    out = layer(x)
    for b in range(2):
        ids = layer.group_ids(x[b : b + 1], None)[0].tolist()
        assert torch.allclose(out[b], neighbour_strict_reference(layer, x[b], ids), atol=1e-10)


@pytest.mark.parametrize("skew", [0.0, 1.2])
def test_every_query_sees_its_window_of_most_recent_group_members(skew):
    """Per head set, token t has exactly min(l, 1 + earlier tokens of its group) keys, all of its group, all <= t."""
    size, length, clusters, groups = 8, 97, 12, 3
    layer = make_cluster_layer(size, 4, clusters, groups, skewed_shares(clusters, skew, 3))
    ids = torch.multinomial(layer.shares.double(), 2 * length, replacement=True).view(2, length)
    grouped = band_group_ids(ids, cluster_to_group(layer.shares, groups, layer.groupings))  # n x B x T
    for j, (q_pos, k_pos, allowed) in enumerate(layer.attention_layouts(ids, None)):
        real = (q_pos >= 0) & (q_pos < length)
        for b in range(2):
            keys = [set() for _ in range(length)]
            hits = allowed[b] & real[b].unsqueeze(-1) & (k_pos[b] >= 0).unsqueeze(-2)
            for w, qi, kj in torch.nonzero(hits).tolist():
                keys[int(q_pos[b, w, qi])].add(int(k_pos[b, w, kj]))
            g = grouped[j, b].tolist()
            for t in range(length):
                members = [s for s in range(t + 1) if g[s] == g[t]]
                assert keys[t] == set(members[-size:]), (j, b, t)


def test_group_cuts_are_runs_of_neighbouring_clusters_balanced_by_share():
    shares = skewed_shares(64, 1.0, 5)
    table = cluster_to_group(shares, 6, 2)  # 2 x 64
    for row in table:
        assert torch.all(row[1:] >= row[:-1]), "groups are runs of consecutive clusters of the greedy order"
    for j, row in enumerate(table):
        mass = torch.zeros(8, dtype=torch.float64).index_add_(0, row, shares.double())
        inner = mass[1:6] if j else mass[:6]  # the shifted grouping's first and last groups are half groups
        assert float(inner.max()) <= 1 / 6 + float(shares.max()) + 1e-9
    # the shifted grouping cuts elsewhere: no cut point is shared by the two groupings
    cuts = [set(torch.nonzero(row[1:] != row[:-1]).reshape(-1).tolist()) for row in table]
    assert cuts[0] and cuts[1] and not cuts[0] & cuts[1]
    assert default_groups(3072, 256, 512) == 6 and default_groups(100, 256, 512) == 1


def test_centroid_order_changes_strict_outputs_now():
    """Neighbouring clusters share groups, so the greedy order matters (own-cluster bands ignored it)."""
    layer = make_cluster_layer(8, 4, 16, 4, None)
    x = torch.randn(1, 64, C, dtype=torch.float64)
    base = layer(x)
    permuted = layer.centroids[torch.randperm(16, generator=torch.Generator().manual_seed(2))].clone()
    layer.set_centroids(permuted)
    assert (layer(x) - base).abs().max() > 1e-3


def test_refresh_measures_each_clusters_share_of_the_bank():
    gen = torch.Generator().manual_seed(0)
    centres = torch.nn.functional.normalize(torch.randn(4, C, generator=gen), dim=-1)
    counts = [400, 200, 100, 50]
    states = torch.cat([c + 0.05 * torch.randn(n, C, generator=gen) for c, n in zip(centres, counts)])
    result = refresh_layer(states, 4, 20, seed=1, backend="torch")
    assert torch.isclose(result.shares.sum(), torch.tensor(1.0))
    ids = cluster_ids_reference(states.double(), result.centroids.double())
    expected = torch.bincount(torch.tensor(ids), minlength=4).float() / len(ids)
    assert torch.allclose(result.shares, expected)
    assert float(result.shares.max()) > 0.3, "skewed banks give skewed shares"


def test_checkpoint_without_shares_loads_with_equal_shares():
    layer = make_cluster_layer(8, 4, 6, 2, skewed_shares(6, 1.0, 1))
    state = {k: v for k, v in layer.state_dict().items() if k != "shares"}
    fresh = make_cluster_layer(8, 4, 6, 2, skewed_shares(6, 2.0, 9))
    fresh.load_state_dict(state)
    assert torch.allclose(fresh.shares, torch.full((6,), 1 / 6, dtype=fresh.shares.dtype))


KINDS = [*((kind, "strict") for kind in LAYER_KINDS), ("none", "strict"), ("cluster", "paper")]


@pytest.mark.parametrize("merge", ["layer", "attention"])
@pytest.mark.parametrize("kind,causality", KINDS)
def test_whole_model_is_strictly_causal(lm_data, kind, causality, merge):
    """Change only the tokens after t: every log-prob at positions <= t stays the same, through the embeddings,
    positions and all layers. Paper causality is the control: it must fail the same check."""
    task, model = build(
        lm_data, "--long-range-layer", kind, "--cluster-causality", causality, "--window-merge", merge,
        "--num-clusters", "8", "--cluster-groups", "3", "--window-size", "16", "--window-stride", "8",
    )  # fmt: skip
    model = model.double().eval()
    for layer in model.decoder.long_range_layers():
        gen = torch.Generator().manual_seed(4)
        layer.set_centroids(
            torch.nn.functional.normalize(torch.randn(8, layer.centroids.size(1), generator=gen), dim=-1)
        )
    vocab = len(task.source_dictionary)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, vocab, (2, 120), generator=gen)
    with torch.no_grad():
        base = model.get_normalized_probs(model(tokens), log_probs=True)
        worst = 0.0
        for t in (10, 57, 100):
            changed = tokens.clone()
            changed[:, t + 1 :] = torch.randint(4, vocab, changed[:, t + 1 :].shape, generator=gen)
            moved = model.get_normalized_probs(model(changed), log_probs=True)
            worst = max(worst, float((moved[:, : t + 1] - base[:, : t + 1]).abs().max()))
    if causality == "paper":
        assert worst > 1e-3, "paper mode should leak future tokens into earlier log-probs"
    else:
        assert worst < 1e-10


def test_cluster_groups_flag_is_checked(lm_data):
    with pytest.raises(ValueError, match="--cluster-groups"):
        build(lm_data, "--cluster-groups", "-1")
    _, model = build(lm_data, "--window-size", "32", "--window-stride", "16")  # --tokens-per-sample 256
    assert {layer.num_band_groups for layer in model.decoder.long_range_layers()} == {4}


def test_layer_settings_are_unchanged_by_the_strict_path():
    """The band path and the windows path share the layer's parameters: a layer built for one mode loads the other's
    weights, so a checkpoint can be scored in either causality."""
    strict = make_cluster_layer(8, 4, 6, 2, None)
    paper = ClusterFormerLayer(dataclasses.replace(strict.settings), 6, "paper", 2).double()
    paper.load_state_dict(strict.state_dict())
    assert set(strict.state_dict()) == set(paper.state_dict())
