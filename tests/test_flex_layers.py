"""``--attention-backend flex``: every layer kind computes what its eager attention computes, with padding and with
lengths that are not multiples of FlexAttention's block; the cached block structures are exactly the blocks the
windows touch; the flags reach every layer of the models; what FlexAttention cannot do is refused by name.

On the CPU torch's FlexAttention is a dense reference without a backward pass, so the layers are compared under
``torch.no_grad()`` there; with ``--device cuda`` (``make gpu-check``'s device tests) they run FlexAttention's kernel
and the gradients are compared too. The dense CPU reference ignores the block structure, which is why the structures
are checked on their own against torch's ``create_block_mask``.

B = batch, T = tokens, C = channels.
"""

from __future__ import annotations

import pytest
import torch

from fairseq_clusterformer.layers.build import build_layer, configure_layers
from fairseq_clusterformer.layers.kinds import LongRangePlan
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.ops import flex_windows
from tests.data.qa_model.synthetic import shared_data
from tests.layer_kinds import KINDS
from tests.layer_kinds import make as make_kind
from tests.test_model import build as build_lm
from tests.test_qa_model import build as build_qa

pytest.importorskip("torch.nn.attention.flex_attention")
from torch.nn.attention.flex_attention import create_block_mask  # noqa: E402

C, HEADS = 64, 4  # head dim 16: the smallest FlexAttention's GPU kernels take


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


def make(kind: str) -> torch.nn.Module:
    return make_kind(kind, C, 128, HEADS, 48, 24, 8)


@pytest.mark.parametrize("kind", list(KINDS))
def test_flex_layers_compute_what_the_eager_layers_compute(kind, device):
    """Lengths below one block, across blocks and not multiples of the block (128); the last row right-padded."""
    layer = make(kind).to(device)
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    layer.to(dtype)
    # on a GPU each length compiles FlexAttention's kernels anew (minutes for every kind): the one length that spans
    # blocks, ends inside one and has padding
    for length in (37, 130, 300) if device.type == "cpu" else (300,):
        gen = torch.Generator().manual_seed(length)
        x = torch.randn(2, length, C, dtype=dtype, generator=gen).to(device)
        pad = torch.zeros(2, length, dtype=torch.bool, device=device)
        pad[1, length - 29 :] = True
        results = {}
        for backend in ("eager", "flex"):
            layer.attention_backend = backend
            layer.zero_grad(set_to_none=True)
            if hasattr(layer, "draws"):
                layer.draws.restart()  # LSH draws its rotations in training: the same draw for both backends
            if device.type == "cpu":
                with torch.no_grad():
                    results[backend] = [layer(x, pad)]
            else:
                source = x.clone().requires_grad_(True)
                out = layer(source, pad)
                out.backward(torch.randn_like(out))
                results[backend] = [out.detach(), source.grad, *(p.grad for p in layer.parameters())]
        for eager, flex in zip(results["eager"], results["flex"]):
            error = ((eager - flex).norm() / eager.norm()).item()
            assert error < (1e-10 if device.type == "cpu" else 1e-4), (kind, length, error)


@pytest.mark.parametrize("kind", ["window", "window-band", "cluster-strict", "cluster-strict-next", "cluster-paper"])
def test_compiled_flex_layers_trace_whole_and_compute_the_same(kind):
    """``--compile-layers on --attention-backend flex``: the block mask is built inside the graph (no Python-side
    cache is read while traced) and the layer still traces as one graph. Through AOT autograd without Inductor:
    Inductor's CPU FlexAttention kernel takes none of these masks (NoValidChoicesError), and on a CPU there is no
    backward pass to compile; the GPU's kernels run in ``make gpu-check``'s ``layers`` part."""
    from fairseq_clusterformer.layers.sorted_window import SortedWindowLayer
    from fairseq_clusterformer.layers.windowed import SlidingWindowLayer

    layer = make(kind).eval()
    layer.attention_backend = "flex"
    decorated = SlidingWindowLayer.forward if isinstance(layer, SlidingWindowLayer) else SortedWindowLayer.attend
    compiled = torch.compile(decorated.uncompiled, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 300, C)
    pad = torch.zeros(2, 300, dtype=torch.bool)
    pad[1, 280:] = True
    torch._dynamo.reset()
    with torch.no_grad():
        got, expected = compiled(layer, x, pad), decorated.uncompiled(layer, x, pad)
    torch._dynamo.reset()
    got, expected = (got[0], expected[0]) if isinstance(got, tuple) else (got, expected)
    assert torch.allclose(got, expected, atol=1e-5)


def dense_blocks(parts, q_blocks: int, kv_blocks: int) -> torch.Tensor:
    """(kv count, kv indices, ...) -> the Qb x KVb boolean of the blocks listed."""
    counts, indices = parts[0][0, 0], parts[1][0, 0]
    listed = torch.arange(indices.size(-1))[None, :] < counts[:, None].long()  # Qb x KVb
    dense = torch.zeros(q_blocks, kv_blocks, dtype=torch.bool)
    dense.scatter_(1, indices.long(), listed)
    return dense


def torch_blocks(mask_mod, q_len: int, kv_len: int, block: int) -> torch.Tensor:
    reference = create_block_mask(mask_mod, None, None, q_len, kv_len, device="cpu", BLOCK_SIZE=block)
    counts = reference.kv_num_blocks + (reference.full_kv_num_blocks if reference.full_kv_num_blocks is not None else 0)
    return reference.to_dense()[0, 0].bool(), counts


@pytest.mark.parametrize("length", [5, 16, 37, 64, 100])
@pytest.mark.parametrize("reach", [1, 7, 16, 40])
def test_the_band_structure_lists_exactly_the_blocks_the_band_touches(length, reach):
    block = 16
    parts = flex_windows.band_structure(length, reach, block, torch.device("cpu"))
    expected, _ = torch_blocks(lambda b, h, q, k: (k <= q) & (q - k < reach), length, length, block)
    blocks = -(-length // block)
    assert torch.equal(dense_blocks(parts, blocks, blocks), expected)
    # the query-side lists (the backward pass walks them) are the transpose
    assert torch.equal(dense_blocks(parts[2:], blocks, blocks), expected.t())


@pytest.mark.parametrize("length", [5, 16, 37, 64, 100])
@pytest.mark.parametrize("size, stride", [(8, 4), (16, 8), (12, 5), (40, 16)])
def test_the_window_structure_lists_exactly_the_blocks_the_window_copies_touch(length, size, stride):
    block = 16
    copies = flex_windows.window_copies(length, size, stride)
    padded = -(-length // block) * block

    def in_window(b, h, q, k):
        t = q % padded
        start = (t // stride - q // padded) * stride
        return (t < length) & (start >= 0) & (k >= start) & (k < start + size)

    parts = flex_windows.window_structure(length, size, stride, copies, block, torch.device("cpu"))
    expected, _ = torch_blocks(in_window, copies * padded, length, block)
    assert torch.equal(dense_blocks(parts, copies * padded // block, -(-length // block)), expected)


def test_copy_weights_average_every_window_that_holds_a_token():
    from fairseq_clusterformer.ops.windows import coverage

    for length, size, stride in [(37, 8, 4), (50, 12, 5), (3, 16, 8)]:
        weights = flex_windows.copy_weights(length, size, stride, None, torch.float64)  # r x T
        assert torch.allclose(weights.sum(0), torch.ones(length, dtype=torch.float64))
        assert torch.equal((weights > 0).sum(0).double(), coverage(length, size, stride, None, torch.float64))


def test_the_backend_refuses_what_flex_attention_cannot_compute():
    layer = make("cluster-strict")
    layer.attention_backend = "flex"
    x = torch.randn(1, 20, C)
    with pytest.raises(RuntimeError, match="--attention-backend flex computes gradients on CUDA only"):
        layer(x)
    dropped = build_layer(
        1,
        LayerSettings(C, 128, HEADS, 48, 24, attention_dropout=0.1),
        LongRangePlan(frozenset({1}), "cluster", 8, "strict", band_groups=3),
    ).train()
    dropped.attention_backend = "flex"
    with pytest.raises(ValueError, match="--attention-dropout is 0.1"):
        dropped(x)
    with torch.no_grad():
        dropped.eval()(x)  # evaluation has no dropout: the backend serves it


def test_the_flags_reach_every_layer_of_both_models(lm_data, qa_data):
    flags = ["--compile-layers", "on", "--attention-backend", "flex"]
    _, lm = build_lm(lm_data, *flags)
    assert [(layer.compile_mode, layer.attention_backend) for layer in lm.decoder.layers] == [("on", "flex")] * 4
    _, lm = build_lm(lm_data)  # the defaults
    assert {(layer.compile_mode, layer.attention_backend) for layer in lm.decoder.layers} == {("auto", "eager")}
    _, qa = build_qa(qa_data, *flags)
    layers = qa.encoder.sentence_encoder.layers
    assert {(layer.compile_mode, layer.attention_backend) for layer in layers} == {("on", "flex")}
    assert configure_layers(qa.modules(), "off", "eager") == len(layers)
