"""The paper's baselines (LSH, sparse) and --window-merge attention against loop references; causality of every
long-range layer kind; the kinds through fairseq's parser."""

import dataclasses

import pytest
import torch

from fairseq_clusterformer.layers.baselines import LSHLayer, StridedSparseLayer
from fairseq_clusterformer.layers.build import build_layer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.kinds import LongRangePlan, long_range_choices
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from fairseq_clusterformer.ops.lsh import lsh_buckets
from tests.reference import (
    attention_merge_reference,
    lsh_ids_reference,
    neighbour_strict_reference,
    sliding_reference,
    sorted_paper_reference,
    sorted_strict_reference,
)
from tests.test_layers import C, make, random_centroids, settings


def reference_for(causality):
    """Paper: windows of the sorted list; strict: each head set's band over groups of neighbouring buckets."""
    return sorted_paper_reference if causality == "paper" else neighbour_strict_reference


@pytest.mark.parametrize("causality", ["paper", "strict"])
@pytest.mark.parametrize("length", [5, 19, 31])
def test_lsh_layer_in_eval_matches_loop_reference_with_its_fixed_rotations(causality, length):
    layer = make(LSHLayer, settings(), 4, causality)
    x = torch.randn(2, length, C, dtype=torch.float64)
    out = layer(x)
    for b in range(2):
        ids = lsh_ids_reference(x[b], layer.eval_rotations)
        assert len(set(ids)) > 1, "the test needs more than one bucket to mean anything"
        assert torch.allclose(out[b], reference_for(causality)(layer, x[b], ids), atol=1e-10)


@pytest.mark.parametrize("causality", ["paper", "strict"])
@pytest.mark.parametrize("length", [4, 17, 30])
def test_sparse_layer_matches_loop_reference_over_offset_groups(causality, length):
    layer = make(StridedSparseLayer, settings(size=4, stride=3), causality)
    x = torch.randn(2, length, C, dtype=torch.float64)
    out = layer(x)
    ids = [t % 3 for t in range(length)]
    for b in range(2):
        # the sparse pattern is exact: every head attends within its offset group
        paper = causality == "paper"
        expected = sorted_paper_reference(layer, x[b], ids) if paper else sorted_strict_reference(layer, x[b], [ids])
        assert torch.allclose(out[b], expected, atol=1e-10)


def test_sparse_strict_layer_sees_exactly_the_positions_a_multiple_of_the_stride_back():
    layer = make(StridedSparseLayer, settings(size=5, stride=4), "strict")
    x = torch.randn(1, 20, C, dtype=torch.float64)
    base = layer(x)
    for t in range(20):
        for j in range(t):
            changed = x.clone()
            changed[0, j] += torch.randn(C, dtype=torch.float64)  # not a constant: the pre-norm would remove it
            moved = not torch.allclose(layer(changed)[0, t], base[0, t], atol=1e-12)
            # window 5 = itself and its 4 predecessors in its offset group: t - 4, t - 8, t - 12, t - 16
            assert moved == (j in (t - 4, t - 8, t - 12, t - 16)), (t, j)


def test_lsh_draws_new_rotations_in_training_and_fixed_ones_in_eval():
    x = torch.randn(1, 64, C, dtype=torch.float64)
    torch.manual_seed(0)
    layer = make(LSHLayer, settings(), 8, "strict").train()
    first = layer.draw_rotations().clone()
    ids = layer.group_ids(x, None)
    assert torch.equal(ids, lsh_buckets(x, first)), "training hashes with the directions just drawn"
    assert not torch.equal(layer.draw_rotations(), first), "every draw is new"
    torch.manual_seed(1)
    layer(x)  # the forward pre-hook draws
    assert not torch.equal(layer.train_rotations, first)
    torch.manual_seed(0)
    assert torch.equal(layer.draw_rotations(), first), "a new torch seed restarts the layer's draws: runs repeat"
    layer.eval()
    other = make(LSHLayer, settings(), 8, "strict").eval()
    assert torch.equal(layer.group_ids(x, None), other.group_ids(x, None))
    assert "eval_rotations" not in layer.state_dict() and "train_rotations" not in layer.state_dict()


def test_lsh_training_draws_leave_torchs_stream_alone_and_differ_by_layer():
    """The rotations come from the layer's own stream: torch's global stream (dropout masks, the QA heads' initial
    weights) is where the sliding-window model of the same seed has it, and two layers hash with other directions."""
    fifth, sixth = (LSHLayer(settings(), 8, stream=i).train() for i in (5, 6))
    torch.manual_seed(3)
    expected = torch.rand(5)
    torch.manual_seed(3)
    fifth.draw_rotations()
    sixth.draw_rotations()
    assert torch.equal(torch.rand(5), expected)
    assert not torch.equal(fifth.train_rotations, sixth.train_rotations)


def test_lsh_refuses_to_hash_in_training_before_its_first_draw():
    layer = LSHLayer(settings(), 8).train()
    with pytest.raises(RuntimeError, match="draw_rotations"):
        layer.group_ids(torch.randn(1, 10, C), None)


def test_lsh_needs_an_even_bucket_count_and_says_which_flag():
    with pytest.raises(ValueError, match="--num-clusters"):
        LSHLayer(settings(), 5)


def every_kind(causality, merge="layer"):
    s = dataclasses.replace(settings(), window_merge=merge)
    layers = {"none": SlidingWindowLayer(s)}
    for kind in long_range_choices():
        if kind != "none":
            layers[kind] = build_layer(1, s, LongRangePlan(frozenset({1}), kind, 4, causality))
    for layer in layers.values():
        layer.double().eval()
        if isinstance(layer, ClusterFormerLayer):
            random_centroids(layer, 4)
    return layers


def _future_changes_past(layer, x, t):
    changed = x.clone()
    changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :]) * 3
    return not torch.allclose(layer(x)[:, : t + 1], layer(changed)[:, : t + 1], atol=1e-12)


@pytest.mark.parametrize("merge", ["layer", "attention"])
def test_every_kind_in_strict_mode_is_strictly_causal(merge):
    torch.manual_seed(0)
    for kind, layer in every_kind("strict", merge).items():
        for seed in range(6):
            x = torch.randn(2, 27, C, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
            for t in (0, 5, 13, 25):
                assert not _future_changes_past(layer, x, t), f"{kind}: future leaked into position <= {t}"


def test_lsh_in_training_is_strictly_causal_for_one_draw_of_rotations():
    layer = make(LSHLayer, settings(), 4, "strict").train()
    x = torch.randn(2, 27, C, dtype=torch.float64)
    for t in (3, 14):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
        layer.draws.restart()  # the same draw for both inputs
        before = layer(x)[:, : t + 1]
        layer.draws.restart()
        assert torch.allclose(before, layer(changed)[:, : t + 1], atol=1e-12)


@pytest.mark.parametrize("causality", ["paper", "strict"])
@pytest.mark.parametrize("merge", ["layer", "attention"])
def test_every_kind_ignores_right_padding(causality, merge):
    for kind, layer in every_kind(causality, merge).items():
        x = torch.randn(2, 15, C, dtype=torch.float64)
        padded = torch.cat([x, torch.randn(2, 8, C, dtype=torch.float64) * 5], dim=1)
        mask = torch.zeros(2, 23, dtype=torch.bool)
        mask[:, 15:] = True
        assert torch.allclose(layer(x), layer(padded, mask)[:, :15], atol=1e-12), kind


@pytest.mark.parametrize("length", [1, 6, 17, 24])
@pytest.mark.parametrize("normalize_before", [True, False])
def test_attention_merge_matches_its_loop_reference(length, normalize_before):
    s = dataclasses.replace(settings(normalize_before=normalize_before), window_merge="attention")
    layer = make(SlidingWindowLayer, s)
    x = torch.randn(2, length, C, dtype=torch.float64)
    out = layer(x)
    for b in range(2):
        assert torch.allclose(out[b], attention_merge_reference(layer, x[b]), atol=1e-10)


def test_the_two_merges_differ_where_windows_overlap_and_agree_on_the_strict_band():
    x = torch.randn(1, 24, C, dtype=torch.float64)
    for size, stride in ((6, 5), (6, 3)):
        layer = make(SlidingWindowLayer, settings(size=size, stride=stride))
        fast = make(SlidingWindowLayer, dataclasses.replace(layer.settings, window_merge="attention"))
        assert not torch.allclose(layer(x), fast(x), atol=1e-6)
    # strict causality's band has no overlap: both merges are the same computation
    layer = make(ClusterFormerLayer, settings(), 4, "strict")
    fast = make(ClusterFormerLayer, dataclasses.replace(settings(), window_merge="attention"), 4, "strict")
    random_centroids(layer, 4)
    random_centroids(fast, 4)
    assert torch.allclose(layer(x), fast(x), atol=1e-10)
    assert torch.allclose(layer(x)[0], neighbour_strict_reference(layer, x[0], layer.cluster_ids(x, None)[0].tolist()))


def test_sliding_reference_still_holds_for_layer_merge():
    layer = make(SlidingWindowLayer, settings())
    x = torch.randn(1, 13, C, dtype=torch.float64)
    assert torch.allclose(layer(x)[0], sliding_reference(layer, x[0]), atol=1e-10)


def test_unknown_window_merge_names_the_flag():
    with pytest.raises(ValueError, match="--window-merge"):
        LayerSettings(C, 32, 2, 6, 3, window_merge="token")
