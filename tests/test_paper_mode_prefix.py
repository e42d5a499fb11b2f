"""Paper causality's leak seen through a prefix: the output at t computed from the whole sequence against the one
computed from the sequence cut right after t (what ``fairseq-clusterformer-causal-eval`` does per token).

The fixed-length check of ``tests/test_strict_reach.py`` (change the tokens after t, keep the length) cannot see the
``sparse`` kind's leak in paper mode: its groups are the offsets ``t mod m``, so at a given length the sort, and with
it every window, is the same whatever the tokens are. Cutting the sequence changes how many tokens each offset holds,
which moves the windows of the sorted sequence, so earlier outputs change. Strict mode gives the same outputs on a
prefix for every kind. B = batch, T = tokens, C = channels.
"""

import pytest
import torch

from fairseq_clusterformer.layers.build import build_layer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.kinds import KINDS, LongRangePlan
from fairseq_clusterformer.layers.settings import LayerSettings
from tests.test_model import build

C = 8
LENGTH = 40
CUTS = (9, 22, 30)  # t: the prefix is positions 0..t
LEAK = 1e-3  # a leak moves outputs by far more than this (0.1-2 in these layers)
EXACT = 1e-10  # float64 rounding


def long_range_layer(kind: str, causality: str) -> torch.nn.Module:
    """One long-range layer in float64, window 8, stride 4, 4 clusters / buckets (sparse: the 4 offsets)."""
    torch.manual_seed(0)
    settings = LayerSettings(C, 16, 2, 8, 4, causal=True, normalize_before=True)
    layer = build_layer(1, settings, LongRangePlan(frozenset({1}), kind, 4, causality)).double().eval()
    if isinstance(layer, ClusterFormerLayer):
        layer.set_centroids(torch.nn.functional.normalize(torch.randn(4, C, dtype=torch.float64), dim=-1))
    return layer


def sequence(seed: int, length: int = LENGTH) -> torch.Tensor:
    return torch.randn(2, length, C, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))  # B x T x C


@torch.no_grad()
def prefix_change(layer: torch.nn.Module, x: torch.Tensor) -> float:
    """Largest change at positions <= t when the input is cut right after t, over ``CUTS``."""
    full = layer(x)  # B x T x C
    return max(float((layer(x[:, : t + 1]) - full[:, : t + 1]).abs().max()) for t in CUTS)


@torch.no_grad()
def future_change(layer: torch.nn.Module, x: torch.Tensor) -> float:
    """Largest change at positions <= t when the tokens after t are replaced and the length is kept, over ``CUTS``."""
    full = layer(x)  # B x T x C
    worst = 0.0
    for t in CUTS:
        changed = x.clone()
        changed[:, t + 1 :] = sequence(t, LENGTH - t - 1) * 3  # B x (T - t - 1) x C
        worst = max(worst, float((layer(changed)[:, : t + 1] - full[:, : t + 1]).abs().max()))
    return worst


def test_sparse_paper_layer_passes_the_fixed_length_check_and_leaks_on_a_prefix():
    layer = long_range_layer("sparse", "paper")
    x = sequence(1)
    assert future_change(layer, x) < EXACT, "at a fixed length the offsets fix the sort: later tokens change nothing"
    assert prefix_change(layer, x) > LEAK, "a shorter sequence moves the windows of the sorted sequence"


@pytest.mark.parametrize("kind", [name for name, kind in KINDS.items() if kind.grouped])
def test_paper_layers_whose_groups_depend_on_the_states_fail_both_checks(kind):
    layer = long_range_layer(kind, "paper")
    x = sequence(2)
    assert future_change(layer, x) > LEAK
    assert prefix_change(layer, x) > LEAK


@pytest.mark.parametrize("kind", list(KINDS))
def test_strict_layers_give_a_prefix_the_outputs_of_the_whole_sequence(kind):
    layer = long_range_layer(kind, "strict")
    x = sequence(3)
    assert prefix_change(layer, x) < EXACT
    assert future_change(layer, x) < EXACT


@pytest.mark.parametrize("causality", ["paper", "strict"])
def test_whole_model_with_sparse_layers_scores_a_prefix(lm_data, causality):
    """Through embeddings, positions and every layer: the log-probs at positions <= t from the tokens cut after t.
    In paper mode they move (the plain perplexity of ``fairseq-eval-lm`` then differs from the causal one); in
    strict mode they are the same."""
    _, model = build(
        lm_data, "--long-range-layer", "sparse", "--cluster-causality", causality,
        "--window-size", "16", "--window-stride", "8",
    )  # fmt: skip
    model = model.double().eval()
    tokens = torch.randint(4, 200, (2, 120), generator=torch.Generator().manual_seed(4))  # B x T
    with torch.no_grad():
        full = model.get_normalized_probs(model(tokens), log_probs=True)  # B x T x V
        moved = 0.0
        for t in (37, 70, 100):
            prefix = model.get_normalized_probs(model(tokens[:, : t + 1]), log_probs=True)  # B x (t + 1) x V
            moved = max(moved, float((prefix - full[:, : t + 1]).abs().max()))
    if causality == "paper":
        assert moved > LEAK
    else:
        assert moved < EXACT
