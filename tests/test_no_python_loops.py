"""No layer loops in Python over windows, clusters, groups, tokens or batch rows.

B = batch, T = tokens, C = channels, P = clusters.

A TorchDispatchMode counts the aten operators one forward (and one backward) of a layer dispatches. A Python loop
over windows, clusters or batch rows would dispatch more operators as T, P or B grows, so for every layer kind the
count must stay the same across lengths, batch sizes and cluster counts. The loop-based reference of
``tests/reference.py`` shows that the counter does see such a loop.
"""

import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_clusterformer.layers.build import build_layer
from fairseq_clusterformer.layers.kinds import LongRangePlan, long_range_choices
from fairseq_clusterformer.layers.settings import CAUSALITY_CHOICES, WINDOW_MERGE_CHOICES, LayerSettings
from tests.reference import sliding_reference

DIM, HEADS, WINDOW, STRIDE = 16, 2, 8, 4
# off the stride, so that every length pads its last window the same way; from 1 window to 33
LENGTHS = (3, 19, 67, 131)
BATCHES = (1, 3)
CLUSTERS = (4, 16)
# the strict mode's groups of neighbouring clusters: one group, and as many groups as the smaller cluster count
GROUPS = (1, 4)


# Whether ``reshape`` returns a view or copies (clone + _unsafe_view) depends on the strides, which change with B
# (a batch of one is contiguous in more ways) and with a single window; these say nothing about loops, so they are
# not counted. Every kernel a loop would repeat (matmuls, softmax, gathers, masks, ...) is.
LAYOUT_OPS = {torch.ops.aten.clone.default, torch.ops.aten._unsafe_view.default}
# For the same reason a Linear on B x T x C runs as one addmm or as mm + add: count addmm as the two it fuses.
FUSED_OPS = {torch.ops.aten.addmm.default: 2}


class OpCounter(TorchDispatchMode):
    """Counts the compute operators dispatched inside the ``with`` block (views and layout copies excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func not in LAYOUT_OPS:
            self.count += FUSED_OPS.get(func, 1)
        return func(*args, **(kwargs or {}))


def layer_kinds() -> list[tuple[str, str, str]]:
    """(long-range choice, causality, window merge) of every layer the decoder can build."""
    kinds = []
    for choice, merge in itertools.product(long_range_choices(), WINDOW_MERGE_CHOICES):
        modes = ("strict",) if choice == "none" else CAUSALITY_CHOICES
        kinds += [(choice, mode, merge) for mode in modes]
    return kinds


def build(choice: str, causality: str, merge: str, clusters: int, groups: int = 1) -> torch.nn.Module:
    settings = LayerSettings(
        embed_dim=DIM,
        ffn_dim=2 * DIM,
        heads=HEADS,
        window_size=WINDOW,
        window_stride=STRIDE,
        normalize_before=True,
        dropout=0.1,
        attention_dropout=0.1,
        activation_dropout=0.1,
        window_merge=merge,
    )
    plan = LongRangePlan(
        layers=frozenset({1}), kind=choice, num_clusters=clusters, causality=causality, band_groups=groups
    )
    return build_layer(1, settings, plan)


def count_ops(layer: torch.nn.Module, batch: int, length: int, training: bool) -> tuple[int, int]:
    """(forward, backward) operator counts of one pass over a random B x T x C input with a padded last row."""
    torch.manual_seed(0)
    layer.train(training)
    x = torch.randn(batch, length, DIM, requires_grad=True)  # B x T x C
    padding_mask = torch.zeros(batch, length, dtype=torch.bool)  # B x T
    padding_mask[-1, length - length // 3 :] = True
    forward, backward = OpCounter(), OpCounter()
    with forward:
        out = layer(x, padding_mask)
    with backward:
        out.sum().backward()
    return forward.count, backward.count


@pytest.mark.parametrize("choice,causality,merge", layer_kinds())
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_operator_count_does_not_grow(choice, causality, merge, training):
    counts = {}
    for clusters, groups, batch, length in itertools.product(CLUSTERS, GROUPS, BATCHES, LENGTHS):
        torch.manual_seed(0)
        layer = build(choice, causality, merge, clusters, groups)
        counts[(clusters, groups, batch, length)] = count_ops(layer, batch, length, training)
    forward_counts = {c[0] for c in counts.values()}
    backward_counts = {c[1] for c in counts.values()}
    assert min(forward_counts) > 10, f"the counter saw almost nothing: {counts}"
    assert len(forward_counts) == 1, f"forward operator count varies with (P, G, B, T): {counts}"
    assert len(backward_counts) == 1, f"backward operator count varies with (P, G, B, T): {counts}"


def test_counter_sees_a_python_loop():
    """The loop-over-windows reference dispatches more operators on a longer sequence: the check above can fail."""
    torch.manual_seed(0)
    layer = build("none", "strict", "layer", CLUSTERS[0]).eval()
    counts = []
    for length in LENGTHS[:3]:
        counter = OpCounter()
        with torch.no_grad(), counter:
            sliding_reference(layer, torch.randn(length, DIM))
        counts.append(counter.count)
    assert counts[0] < counts[1] < counts[2], counts
