"""Properties of every long-range layer kind over random sequence lengths, windows, cluster counts and batches.

The kinds come from ``layers.kinds``, so a new kind is tested as soon as it has a row there. B = batch,
T = tokens, C = channels.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_clusterformer.layers.build import build_layer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.kinds import LongRangePlan, long_range_choices
from fairseq_clusterformer.layers.settings import LayerSettings

C = 8
EXAMPLES = settings(max_examples=12, deadline=None)


@st.composite
def layers(draw, causality=st.sampled_from(["strict", "paper"])):
    kind = draw(st.sampled_from(long_range_choices()))
    window = draw(st.integers(2, 9))
    stride = draw(st.integers(1, window - 1))
    # LSH takes the argmax over P/2 random directions and their negatives: P must be even
    clusters = draw(st.integers(1, 3)) * 2 if kind == "lsh" else draw(st.integers(1, 5))
    mode = draw(causality)
    layer_settings = LayerSettings(C, 16, 2, window, stride, causal=True, normalize_before=draw(st.booleans()))
    torch.manual_seed(draw(st.integers(0, 2**16)))
    layer = build_layer(1, layer_settings, LongRangePlan(frozenset({1}), kind, clusters, mode)).double().eval()
    if isinstance(layer, ClusterFormerLayer):
        layer.set_centroids(torch.nn.functional.normalize(torch.randn(clusters, C), dim=-1))
    return layer


def inputs(seed: int, batch: int, length: int) -> torch.Tensor:
    return torch.randn(batch, length, C, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 2


@EXAMPLES
@given(layer=layers(), batch=st.integers(1, 3), length=st.integers(1, 30), seed=st.integers(0, 1000), data=st.data())
def test_output_has_the_input_shape_and_no_nan_even_with_padding(layer, batch, length, seed, data, device):
    x = inputs(seed, batch, length).to(device)
    real = data.draw(st.lists(st.integers(1, length), min_size=batch, max_size=batch))
    pads = torch.arange(length).unsqueeze(0) >= torch.tensor(real).unsqueeze(1)  # B x T, right padding
    out = layer.to(device)(x, pads.to(device))
    assert out.shape == x.shape
    assert torch.isfinite(out).all()


@EXAMPLES
@given(layer=layers(st.just("strict")), length=st.integers(2, 30), seed=st.integers(0, 1000), data=st.data())
def test_strict_layers_are_causal(layer, length, seed, data, device):
    cut = data.draw(st.integers(0, length - 2))
    layer, x = layer.to(device), inputs(seed, 2, length).to(device)
    changed = x.clone()
    changed[:, cut + 1 :] = inputs(seed + 1, 2, length - cut - 1).to(device) * 3
    torch.testing.assert_close(layer(changed)[:, : cut + 1], layer(x)[:, : cut + 1], atol=1e-9, rtol=0)


@EXAMPLES
@given(layer=layers(st.just("strict")), length=st.integers(1, 25), extra=st.integers(1, 12), seed=st.integers(0, 1000))
def test_right_padding_changes_no_real_position(layer, length, extra, seed):
    x = inputs(seed, 2, length)
    padded = torch.cat([x, inputs(seed + 1, 2, extra) * 5], dim=1)  # B x (T + extra), junk in the pads
    pads = torch.arange(length + extra).unsqueeze(0).expand(2, -1) >= length  # B x (T + extra)
    torch.testing.assert_close(layer(padded, pads)[:, :length], layer(x), atol=1e-9, rtol=0)
