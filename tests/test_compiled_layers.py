"""``--compile-layers``: every compiled entry traces whole (no graph break), the compiled layers compute what the eager
ones compute (outputs and gradients to 1e-5), a layer kind compiles a bounded number of times over batches of several
lengths and sizes, and a compiled model keeps the eager model's state dict, pickling and deep copies.

Compiling is slow on a CPU (Inductor builds C++: 20-60 s a graph on a loaded 2-core machine, a few seconds once its
on-disk cache has the graph), so the layers are tiny, each decorated function is compiled once for the whole module
(``compilable`` keeps one ``torch.compile`` per function), and the tests that compile are marked ``slow``.

B = batch, T = tokens, C = channels.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch._dynamo.utils import counters

from fairseq_clusterformer.layers.build import configure_layers
from fairseq_clusterformer.layers.compiled import wants_compile
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.sorted_window import SortedWindowLayer
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from fairseq_clusterformer.qa.encoder import qa_window_pass
from tests.layer_kinds import KINDS
from tests.layer_kinds import make as make_kind

C = 16


def make(kind: str) -> torch.nn.Module:
    return make_kind(kind, C, 32, 4, 8, 4, 6).double()


def entry(layer):
    """The compiled function of a layer and its arguments' order: (layer, x, padding_mask)."""
    decorated = SlidingWindowLayer.forward if isinstance(layer, SlidingWindowLayer) else SortedWindowLayer.attend
    return decorated.uncompiled


def batch(
    bsz: int, length: int, seed: int, channels: int = C, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """B x T x C input and a B x T padding mask with the last row's tail padded."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(bsz, length, channels, dtype=dtype, generator=gen)
    pad = torch.zeros(bsz, length, dtype=torch.bool)
    pad[-1, length - length // 4 :] = True
    return x, pad


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches hold entries per code object (8 at most): the tracing tests leave none for the others."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_layer_kind_traces_as_one_graph(kind, fresh_dynamo):
    layer = make(kind)
    x, pad = batch(2, 21, 0)
    for training in (True, False):
        if training and hasattr(layer, "draw_rotations"):
            layer.draw_rotations()  # what the forward pre-hook does before ``attend``, outside the compiled part
        explanation = torch._dynamo.explain(entry(layer))(layer.train(training), x, pad)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        assert explanation.graph_count == 1


@pytest.mark.parametrize("first", [True, False])
def test_the_qa_window_pass_traces_as_one_graph(first, fresh_dynamo):
    layer = SlidingWindowLayer(LayerSettings(C, 32, 4, 8, 6, causal=False)).double()
    question, context, bsz = 5, 19, 2
    windows = -(-context // 6)
    length = windows * (question + 8) if first else windows * (question + 6)  # K*W or S
    x = torch.randn(bsz, length, C, dtype=torch.float64)
    pad = torch.zeros(bsz, length, dtype=torch.bool)
    explanation = torch._dynamo.explain(qa_window_pass.uncompiled)(layer, x, pad, question, context, first)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def outputs_and_gradients(layer, run, x, pad, grad_seed: int) -> list[torch.Tensor]:
    """``run(layer, x, pad)``'s output (the first, for ``attend``) and the gradients of the input and parameters."""
    x = x.clone().requires_grad_(True)
    out = run(layer, x, pad)
    out = out[0] if isinstance(out, tuple) else out
    grad = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(grad_seed))
    return [out.detach(), *torch.autograd.grad(out, [x, *layer.parameters()], grad)]


def compare(eager, compiled, run, shapes, channels: int, tolerance: float) -> list[int]:
    """``eager`` and its compiled twin on batches of ``shapes`` (B, T); every output and gradient within
    ``tolerance`` of the largest of them (a parameter whose gradient is zero in exact arithmetic, as the key bias's,
    holds only rounding noise). Returns the count of compiled graphs after each batch."""
    counts = []
    for i, (bsz, length) in enumerate(shapes):
        x, pad = batch(bsz, length, i, channels, eager.self_attn.q_proj.weight.dtype)
        expected = outputs_and_gradients(eager, entry(eager), x, pad, i)
        got = outputs_and_gradients(compiled, run, x, pad, i)
        scale = max(float(e.abs().max()) for e in expected)
        for e, g in zip(expected, got):
            assert float((e - g).abs().max()) <= tolerance * scale, (type(eager).__name__, bsz, length)
        counts.append(graphs())
    return counts


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, backend",
    [("window", None), ("cluster-strict", None), ("cluster-paper", None), ("cluster-strict-next", "aot_eager")],
)
def test_compiled_layers_equal_eager(kind, backend, fresh_dynamo):
    """As ``--compile-layers on`` runs them (Inductor), float32, at the tiny LM's shapes (64 channels, windows of
    64 / stride 32: big enough for Inductor's vectorised loops), T = 200 (not a multiple of the stride) with padding:
    the sliding window, the strict band and the paper's windows of a sorted sequence; the band with next values
    through AOT autograd alone (its Inductor build would add a minute). At these shapes torch 2.13's Inductor left the
    sliding window's last T mod m positions unscaled until ``merge_windows`` divided by a coverage over K*m."""
    eager, compiled = (make_kind(kind, 64, 256, 4, 64, 32, 16) for _ in range(2))
    configure_layers([compiled], "on", "eager")
    run = (
        type(compiled).__call__ if backend is None else torch.compile(entry(compiled), backend=backend, fullgraph=True)
    )
    before = graphs()
    counts = compare(eager, compiled, run, [(2, 200)], 64, 1e-5)
    assert counts[-1] == before + 1  # it did compile (one graph), and fullgraph=True means without a break


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["window", "cluster-strict"])
def test_a_layer_kind_compiles_at_most_four_times_over_lengths_and_batch_sizes(kind, fresh_dynamo):
    """Automatic dynamic shapes: a static graph for the first size, one with T symbolic when T changes, one with B
    symbolic too when B changes, one for a batch of one; none for any later length, multiples of the stride and the
    others alike (the strict band pads T up to the stride: compiled, ``WindowScheme.count`` always adds a pad block
    and ``pad_to`` does not branch), nor for another layer of the kind (every layer of a model shares the graphs).
    Dynamo's and AOT autograd's guards decide the graphs, so the cheap ``aot_eager`` backend counts the graphs
    Inductor would make."""
    shapes = [(2, 21), (2, 21), (2, 32), (2, 40), (2, 13), (2, 64), (3, 24), (3, 37), (1, 30), (1, 45), (2, 50)]
    before = graphs()
    eager, compiled, other = make(kind), make(kind), make(kind)
    run = torch.compile(entry(compiled), backend="aot_eager", fullgraph=True)
    counts = [c - before for c in compare(eager, compiled, run, shapes, C, 1e-10)]
    assert counts == [1, 1, 2, 2, 2, 2, 3, 3, 4, 4, 4]
    assert compare(eager, other, run, shapes[:3], C, 1e-10)[-1] - before == 4


def test_a_compiled_model_keeps_its_state_dict_and_pickles():
    eager, compiled = make("cluster-strict"), make("cluster-strict")
    assert configure_layers([compiled], "on", "eager") == 1
    compiled_forward = SortedWindowLayer.attend  # the decorated function, not a per-layer attribute
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert "_orig_mod" not in "".join(compiled.state_dict()) and compiled_forward.__name__ == "attend"
    clone = pickle.loads(pickle.dumps(compiled))
    assert clone.compile_mode == "on" and list(clone.state_dict()) == list(eager.state_dict())
    assert copy.deepcopy(compiled).compile_mode == "on"
    for a, b in zip(clone.state_dict().values(), eager.state_dict().values()):
        assert torch.equal(a, b)


def test_auto_compiles_on_cuda_only_and_bad_values_name_the_flag():
    x = torch.zeros(1, 2, C)
    assert wants_compile("on", x) and not wants_compile("auto", x) and not wants_compile("off", x)
    if torch.cuda.is_available():
        assert wants_compile("auto", x.cuda())
    with pytest.raises(ValueError, match="--compile-layers"):
        configure_layers([make("window")], "yes", "eager")
    with pytest.raises(ValueError, match="--attention-backend"):
        configure_layers([make("window")], "off", "triton")
