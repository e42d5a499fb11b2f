"""``--sliding-windows band``: every token attends to itself and exactly its ``l - 1`` predecessors.

T = tokens, C = channels. The loop reference below shares only the layer's parameters with the batched code.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from tests.reference import sliding_reference, token_output
from tests.test_generation_cache import assert_cache_is_exact
from tests.test_layers import C, make, settings
from tests.test_model import build


def band(size=6, stride=3, normalize_before=True, merge="layer"):
    base = settings(size=size, stride=stride, normalize_before=normalize_before)
    return dataclasses.replace(base, sliding_windows="band", window_merge=merge)


def band_reference(layer, x):
    """Token i of x (T x C) attending to tokens max(0, i - l + 1) .. i, one token at a time."""
    size = layer.settings.window_size
    return torch.stack([token_output(layer, x, i, list(range(max(0, i - size + 1), i + 1))) for i in range(len(x))])


@pytest.mark.parametrize("length", [1, 5, 6, 17, 24])
@pytest.mark.parametrize("normalize_before", [True, False])
@pytest.mark.parametrize("merge", ["layer", "attention"])
def test_band_layer_matches_its_loop_reference(length, normalize_before, merge):
    layer = make(SlidingWindowLayer, band(normalize_before=normalize_before, merge=merge))
    x = torch.randn(2, length, C, dtype=torch.float64)
    out = layer(x)
    for b in range(2):
        torch.testing.assert_close(out[b], band_reference(layer, x[b]), rtol=0, atol=1e-10)


def test_band_reaches_exactly_l_minus_1_tokens_back_where_overlap_reaches_fewer():
    size, t = 6, 13  # t = 13 starts no window, so its later window holds only t - 12 = 1 earlier token
    x = torch.randn(1, 24, C, dtype=torch.float64)
    layer = make(SlidingWindowLayer, band(size=size))
    for j in range(24):
        changed = x.clone()
        changed[0, j] += torch.randn(C, dtype=torch.float64)  # not a constant shift, which LayerNorm removes
        moved = not torch.allclose(layer(x)[0, t], layer(changed)[0, t], atol=1e-12)
        assert moved == (t - size < j <= t), j
    # the paper's overlap at the same l and m: token 13 sits in windows [9, 15) and [12, 18); the first sees 4
    # earlier tokens, the second 1, and the output is their mean, so it differs from the band's
    overlap = make(SlidingWindowLayer, settings(size=size))
    overlap.load_state_dict(layer.state_dict())
    torch.testing.assert_close(overlap(x)[0], sliding_reference(overlap, x[0]), rtol=0, atol=1e-10)
    assert not torch.allclose(overlap(x)[0, t], layer(x)[0, t], atol=1e-6)


def test_band_ignores_right_padding_and_is_causal():
    layer = make(SlidingWindowLayer, band())
    x = torch.randn(2, 15, C, dtype=torch.float64)
    padded = torch.cat([x, torch.randn(2, 8, C, dtype=torch.float64) * 5], dim=1)
    mask = torch.zeros(2, 23, dtype=torch.bool)
    mask[:, 15:] = True
    torch.testing.assert_close(layer(padded, mask)[:, :15], layer(x), rtol=0, atol=1e-12)
    changed = x.clone()
    changed[:, 9:] = torch.randn_like(changed[:, 9:])
    torch.testing.assert_close(layer(changed)[:, :9], layer(x)[:, :9], rtol=0, atol=1e-12)


def test_band_gradients_reach_every_parameter_and_the_input():
    layer = make(SlidingWindowLayer, band()).train()
    x = torch.randn(2, 17, C, dtype=torch.float64, requires_grad=True)
    layer(x).pow(2).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


def test_bad_sliding_windows_values_name_the_flag():
    with pytest.raises(ValueError, match="--sliding-windows"):
        LayerSettings(C, 32, 2, 6, 3, sliding_windows="banded")
    with pytest.raises(ValueError, match="--sliding-windows band is a causal"):
        LayerSettings(C, 32, 2, 6, 3, causal=False, sliding_windows="band")


@pytest.mark.parametrize("kind", ("none", "cluster"))
def test_the_model_flag_builds_band_layers_and_caches_them_exactly(lm_data, kind):
    """Through the model: the flag reaches every sliding-window layer, generation from the cache gives the tokens
    and scores of full recomputation, and every cached position equals the full pass."""
    flags = ["--window-size", 8, "--window-stride", 4, "--num-clusters", 8, "--cluster-groups", 2]
    torch.manual_seed(0)
    task, model = build(lm_data, *flags, "--long-range-layer", kind, "--sliding-windows", "band")
    model.eval()
    sliding = [layer for layer in model.decoder.layers if type(layer) is SlidingWindowLayer]
    assert len(sliding) == (4 if kind == "none" else 2)
    assert all(layer.settings.sliding_windows == "band" for layer in sliding)
    assert_cache_is_exact(task, model, beam=2)
