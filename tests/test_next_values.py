"""``--long-range-values next``: in a strict long-range layer every earlier key carries the value of the token after
it, the query's own key its own value.

T = tokens, C = channels. The loop references share only the layer's parameters with the batched code.
"""

from __future__ import annotations

import pytest
import torch

from fairseq_clusterformer.modules.baseline_layers import LSHLayer, StridedSparseLayer
from fairseq_clusterformer.modules.cluster_layer import ClusterFormerLayer
from fairseq_clusterformer.modules.layer_settings import LongRangePlan
from fairseq_clusterformer.ops.attention import masked_attention, next_value_attention
from fairseq_clusterformer.ops.cluster_stats import next_value_reads
from fairseq_clusterformer.scripts.longrange.longrange_tally import LayerCapture
from tests.reference import (
    cluster_ids_reference,
    lsh_ids_reference,
    neighbour_strict_reference,
    sorted_strict_reference,
)
from tests.test_generation_cache import assert_cache_is_exact
from tests.test_layers import C, make, random_centroids, settings
from tests.test_model import build


def test_next_value_attention_matches_a_loop_over_queries():
    gen = torch.Generator().manual_seed(0)
    n, lq, lk, heads, slot = 3, 4, 9, 2, 5  # query i is key slot 5 + i
    q, own = (torch.randn(n, lq, C, generator=gen, dtype=torch.float64) for _ in range(2))
    k, nxt = (torch.randn(n, lk, C, generator=gen, dtype=torch.float64) for _ in range(2))
    allowed = torch.rand(n, lq, lk, generator=gen) < 0.5
    allowed[:, torch.arange(lq), slot + torch.arange(lq)] = True
    out = next_value_attention(q, k, nxt, own, allowed, heads, slot)
    d = C // heads
    for w in range(n):
        for i in range(lq):
            for h in range(heads):
                cols = slice(h * d, (h + 1) * d)
                keys = allowed[w, i].nonzero().flatten().tolist()
                scores = torch.stack([q[w, i, cols] @ k[w, j, cols] for j in keys]) / d**0.5
                values = torch.stack([own[w, i, cols] if j == slot + i else nxt[w, j, cols] for j in keys])
                expected = torch.softmax(scores, 0) @ values
                torch.testing.assert_close(out[w, i, cols], expected, rtol=0, atol=1e-12)
    # with next values equal to the own values it is ordinary attention
    same = torch.randn(n, lk, C, generator=gen, dtype=torch.float64)
    mine = same[:, slot : slot + lq]
    torch.testing.assert_close(
        next_value_attention(q, k, same, mine, allowed, heads, slot), masked_attention(q, k, same, allowed, heads)
    )


def strict_layers():
    """A cluster, an LSH and a sparse layer in strict mode with next values, and their loop references."""
    cluster = make(ClusterFormerLayer, settings(), 4, "strict", 2, "next")
    random_centroids(cluster, 4)
    lsh = make(LSHLayer, settings(), 4, "strict", 2, "next")
    sparse = make(StridedSparseLayer, settings(size=4, stride=3), "strict", "next")
    ids = cluster_ids_reference
    return {
        "cluster": (cluster, lambda x: neighbour_strict_reference(cluster, x, ids(x, cluster.centroids), True)),
        "lsh": (lsh, lambda x: neighbour_strict_reference(lsh, x, lsh_ids_reference(x, lsh.eval_rotations), True)),
        "sparse": (sparse, lambda x: sorted_strict_reference(sparse, x, [[t % 3 for t in range(len(x))]], True)),
    }  # fmt: skip


@pytest.mark.parametrize("length", [1, 7, 19, 30])
def test_every_strict_kind_with_next_values_matches_its_loop_reference(length):
    for kind, (layer, reference) in strict_layers().items():
        x = torch.randn(2, length, C, dtype=torch.float64)
        out = layer(x)
        for b in range(2):
            torch.testing.assert_close(out[b], reference(x[b]), rtol=0, atol=1e-10, msg=kind)


def test_next_values_are_strictly_causal_and_not_the_own_values():
    x = torch.randn(2, 27, C, dtype=torch.float64)
    for kind, (layer, _) in strict_layers().items():
        for t in (0, 5, 13, 25):
            changed = x.clone()
            changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :]) * 3
            torch.testing.assert_close(layer(changed)[:, : t + 1], layer(x)[:, : t + 1], rtol=0, atol=1e-12)
        own = type(layer).__new__(type(layer))
        own.__dict__ = dict(layer.__dict__, values="own")
        assert not torch.allclose(own(x), layer(x), atol=1e-6), kind


def test_next_values_pass_gradients_to_every_parameter():
    layer, _ = strict_layers()["cluster"]
    layer.train()
    x = torch.randn(2, 23, C, dtype=torch.float64, requires_grad=True)
    layer(x).pow(2).sum().backward()
    assert x.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


def test_next_value_reads_shift_every_earlier_key_by_one():
    keys = torch.zeros(5, 5, dtype=torch.bool)
    keys[4, [0, 2, 4]] = True  # query 4 sees keys 0 and 2, and itself
    keys[1, [0, 1]] = True
    reads = next_value_reads(keys)
    assert reads[4].nonzero().flatten().tolist() == [1, 3, 4]
    assert reads[1].nonzero().flatten().tolist() == [1]  # key 0's value is token 1's, the query itself
    assert reads.sum() == 4


def test_the_capture_reports_the_states_a_next_values_layer_reads():
    layer, _ = strict_layers()["sparse"]
    model = torch.nn.Module()
    model.decoder = torch.nn.Module()
    model.decoder.layers = torch.nn.ModuleList([layer])
    capture = LayerCapture(model)
    layer(torch.randn(1, 10, C, dtype=torch.float64))
    # sparse groups: offsets mod 3; query 9 sees keys 0, 3, 6 and itself, so reads 1, 4, 7 and 9
    assert capture.pairs[1][9].nonzero().flatten().tolist() == [1, 4, 7, 9]


def test_bad_combinations_name_the_flags():
    with pytest.raises(ValueError, match="--long-range-values next needs .* --cluster-causality strict"):
        LongRangePlan(frozenset({2}), "cluster", 8, "paper", values="next")
    with pytest.raises(ValueError, match="--long-range-values next needs long-range layers"):
        LongRangePlan(frozenset({2}), "none", 8, "strict", values="next")
    with pytest.raises(ValueError, match="--long-range-values"):
        LongRangePlan(frozenset({2}), "cluster", 8, "strict", values="previous")


@pytest.mark.parametrize("kind", ("cluster", "sparse"))
def test_the_model_flag_builds_next_value_layers_and_caches_them_exactly(lm_data, kind):
    """Through the model: generation from the cache (keys enter it one step late, with the next token's value)
    gives the tokens and scores of full recomputation, and every cached position equals the full pass."""
    flags = ["--window-size", 8, "--window-stride", 4, "--num-clusters", 8, "--cluster-groups", 2]
    torch.manual_seed(0)
    task, model = build(lm_data, *flags, "--long-range-layer", kind, "--long-range-values", "next")
    model.eval()
    assert [getattr(layer, "values", None) for layer in model.decoder.layers] == [None, "next", None, "next"]
    assert_cache_is_exact(task, model, beam=3)
