"""``--long-range-values next``: in a strict long-range layer every earlier key carries the value of the token after
it, the query's own key its own value.

T = tokens, C = channels. The loop references share only the layer's parameters with the batched code.
"""

from __future__ import annotations

import pytest
import torch

from fairseq_clusterformer.layers.baselines import LSHLayer, StridedSparseLayer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.kinds import LongRangePlan
from fairseq_clusterformer.ops import attention
from fairseq_clusterformer.ops.attention import (
    masked_attention,
    next_value_attention,
    reference_next_value_attention,
)
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


def random_case(n, lq, lk, width, slot, dtype=torch.float32, seed=0, density=0.5):
    """q, k, next_v, own_v (leaf tensors) and a random mask that allows every query's own key (slot + i)."""
    gen = torch.Generator().manual_seed(seed)
    q, own = (torch.randn(n, lq, width, generator=gen, dtype=dtype).requires_grad_() for _ in range(2))
    k, nxt = (torch.randn(n, lk, width, generator=gen, dtype=dtype).requires_grad_() for _ in range(2))
    allowed = torch.rand(n, lq, lk, generator=gen) < density
    allowed[:, torch.arange(lq), slot + torch.arange(lq)] = True
    return q, k, nxt, own, allowed


def outputs_and_grads(fn, q, k, nxt, own, allowed, heads, slot, grad):
    out = fn(q, k, nxt, own, allowed, heads, slot)
    return (out, *torch.autograd.grad(out, (q, k, nxt, own), grad))


@pytest.mark.parametrize(
    "n, lq, lk, heads, slot, density",
    [(3, 5, 12, 2, 7, 0.5), (2, 16, 47, 4, 31, 0.3), (4, 8, 8, 1, 0, 0.9), (2, 32, 63, 8, 31, 0.05)],
)
def test_the_fused_op_equals_the_written_out_reference_in_float32(n, lq, lk, heads, slot, density):
    q, k, nxt, own, allowed = random_case(n, lq, lk, 64, slot, density=density)
    grad = torch.randn(n, lq, 64, generator=torch.Generator().manual_seed(1))
    fused = outputs_and_grads(next_value_attention, q, k, nxt, own, allowed, heads, slot, grad)
    written = outputs_and_grads(reference_next_value_attention, q, k, nxt, own, allowed, heads, slot, grad)
    for name, a, b in zip(("out", "q", "k", "next_v", "own_v"), fused, written):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)


def test_without_the_scale_argument_the_scaled_queries_give_the_same_result(monkeypatch):
    """The torch < 2.1 path (no ``scale=``) folds the scale into q."""
    q, k, nxt, own, allowed = random_case(3, 6, 14, 24, 8, dtype=torch.float64)
    expected = reference_next_value_attention(q, k, nxt, own, allowed, 3, 8)
    monkeypatch.setattr(attention, "_SDPA_HAS_SCALE", False)
    torch.testing.assert_close(next_value_attention(q, k, nxt, own, allowed, 3, 8), expected, rtol=0, atol=1e-12)


def test_the_own_keys_next_value_gets_no_weight_and_no_gradient():
    n, lq, lk, slot = 2, 6, 13, 7
    q, k, nxt, own, allowed = random_case(n, lq, lk, 16, slot)
    own_slots = slot + torch.arange(lq)
    allowed[:, :, own_slots] = False  # no other query sees these keys ...
    allowed[:, torch.arange(lq), own_slots] = True  # ... only their own query
    out = next_value_attention(q, k, nxt, own, allowed, 2, slot)
    out.backward(torch.randn_like(out))
    assert nxt.grad[:, own_slots].eq(0).all()
    assert nxt.grad[:, :slot].abs().sum() > 0 and k.grad[:, own_slots].abs().sum() > 0
    changed = nxt.detach().clone()
    changed[:, own_slots] += 1e3
    assert torch.equal(next_value_attention(q, k, changed, own, allowed, 2, slot), out)


def test_a_query_that_sees_only_its_own_key_gets_its_own_value():
    n, lq, lk, slot = 2, 5, 9, 4
    q, k, nxt, own, _ = random_case(n, lq, lk, 16, slot)
    allowed = torch.zeros(n, lq, lk, dtype=torch.bool)
    allowed[:, torch.arange(lq), slot + torch.arange(lq)] = True
    out = next_value_attention(q, k, nxt, own, allowed, 4, slot)
    torch.testing.assert_close(out, own.detach(), rtol=0, atol=1e-6)
    out.sum().backward()
    assert all(t.grad.isfinite().all() for t in (q, k, nxt, own))


@pytest.mark.parametrize("dtype, atol", [(torch.float16, 1e-2), (torch.bfloat16, 5e-2)])
def test_half_precision_runs_and_stays_close_to_float32(dtype, atol):
    q, k, nxt, own, allowed = random_case(3, 16, 40, 64, 20)
    half = [t.detach().to(dtype).requires_grad_() for t in (q, k, nxt, own)]
    out = next_value_attention(*half, allowed, 4, 20)
    assert out.dtype == dtype
    expected = reference_next_value_attention(q, k, nxt, own, allowed, 4, 20)
    torch.testing.assert_close(out.float(), expected, rtol=0, atol=atol)
    out.float().pow(2).sum().backward()
    assert all(t.grad.isfinite().all() for t in half)
    # q . k sums of ~80,000 overflow fp16 (max 65,504) before the 1/sqrt(d) scale: summed in float32, still finite
    big = [(t * 100).to(torch.float16) for t in (q.detach(), k.detach())]
    assert next_value_attention(*big, nxt.detach().half(), own.detach().half(), allowed, 1, 20).isfinite().all()


def test_dropout_drops_the_own_weight_like_the_others():
    n, lq, lk, slot, p = 1, 4, 9, 5, 0.3
    q, k, nxt, own, allowed = random_case(n, lq, lk, 8, slot)
    alone = torch.zeros_like(allowed)
    alone[:, torch.arange(lq), slot + torch.arange(lq)] = True
    copies = 4000  # the same window many times: every copy draws its own dropout
    args = [t.detach().expand(copies, -1, -1) for t in (q, k, nxt, own)]
    torch.manual_seed(0)
    out = next_value_attention(*args, alone.expand(copies, -1, -1), 2, slot, p)  # copies x Lq x 8
    # a query alone with its own key keeps its own value scaled by 1/(1-p) or loses it
    kept = out.isclose(own.detach() / (1 - p))
    assert (kept | out.eq(0)).all() and 0.6 < kept.float().mean() < 0.8
    # with other keys: the same mean and spread as the written-out reference's dropout
    draws = []
    for fn in (next_value_attention, reference_next_value_attention):
        torch.manual_seed(1)
        draws.append(fn(*args, allowed.expand(copies, -1, -1), 2, slot, p))
    for stat in (torch.mean, torch.std):
        torch.testing.assert_close(stat(draws[0], 0), stat(draws[1], 0), rtol=0, atol=0.05)
    plain = next_value_attention(q, k, nxt, own, allowed, 2, slot)[0].detach()
    torch.testing.assert_close(draws[0].mean(0), plain, rtol=0, atol=0.05)


def test_own_slots_outside_the_keys_are_refused():
    q, k, nxt, own, allowed = random_case(1, 4, 6, 8, 2)
    with pytest.raises(ValueError, match="own key slots 3..6 lie outside the 6 keys"):
        next_value_attention(q, k, nxt, own, allowed, 2, 3)


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
