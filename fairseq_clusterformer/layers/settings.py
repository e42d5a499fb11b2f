"""The settings every windowed and long-range layer is built from, and the rules they follow.

A model turns its flags into a ``LayerSettings`` and a ``kinds.LongRangePlan``; their ``__post_init__`` reject bad
values with an error that names the fairseq flag at fault. The layers, the decoder and the window schemes trust them
and check nothing again; a long-range layer built on its own (tests, benchmarks) runs the rules of every kind through
``check_long_range``. The kinds themselves are rows of ``kinds.py``, which imports the layer classes that import
this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WINDOW_MERGE_CHOICES = ("layer", "attention")
SLIDING_WINDOW_CHOICES = ("overlap", "band")
CAUSALITY_CHOICES = ("strict", "paper")
# what a long-range key's value is: its own state's ("own", the paper), or the state of the token after it ("next")
LONG_RANGE_VALUE_CHOICES = ("own", "next")
# what a long-range layer does with the pretrained layer's sliding window: "replace" it (the paper), or keep it and
# add the long-range attention beside it through a gate that starts at zero ("hybrid", ``layers.hybrid``)
LONG_RANGE_MODE_CHOICES = ("replace", "hybrid")


def check_choice(flag: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{flag} must be one of {tuple(choices)}, got {value!r}")


def check_window(size: int, stride: int) -> None:
    """Reject window/stride pairs for which windows would not overlap or not tile the sequence."""
    if size < 1 or stride < 1:
        raise ValueError(f"--window-size ({size}) and --window-stride ({stride}) must be positive")
    if stride >= size:
        raise ValueError(
            f"--window-stride ({stride}) must be smaller than --window-size ({size}): "
            "the paper's windows overlap (m < l) so that neighbouring windows share states"
        )


@dataclass(frozen=True)
class LayerSettings:
    embed_dim: int
    ffn_dim: int
    heads: int
    window_size: int
    window_stride: int
    causal: bool = True
    normalize_before: bool = False
    dropout: float = 0.0
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation_fn: str = "relu"
    # "layer": the paper, the whole layer runs per window and overlapping outputs are averaged; "attention": only
    # the attention outputs are averaged, then residual, norm and FFN run once per token (half the FFN work at
    # stride l/2). The two agree wherever no token is a query in two windows (the bands: strict causality's and
    # --sliding-windows band); overlapping windows always overlap, as ``check_window`` requires stride < size.
    window_merge: str = "layer"
    # the sliding-window layers: "overlap" (the paper), windows [k*m, k*m + l) with the outputs of overlapping
    # windows averaged, so a token's output mixes a window where it sees up to l - 1 earlier tokens with one where
    # it may see none; "band" (causal only), every token attends to itself and exactly its l - 1 predecessors
    sliding_windows: str = "overlap"

    def __post_init__(self) -> None:
        check_window(self.window_size, self.window_stride)
        check_choice("--window-merge", self.window_merge, WINDOW_MERGE_CHOICES)
        check_choice("--sliding-windows", self.sliding_windows, SLIDING_WINDOW_CHOICES)
        if self.sliding_windows == "band" and not self.causal:
            raise ValueError("--sliding-windows band is a causal (language model) scheme; bidirectional layers overlap")
        # the LM's flags say decoder, the QA model's encoder: name both
        if self.heads < 1 or self.embed_dim % self.heads:
            raise ValueError(
                f"the embedding dim ({self.embed_dim}) must be a positive multiple of the number of attention heads "
                f"({self.heads}): --decoder-embed-dim / --decoder-attention-heads (--encoder-* for QA)"
            )


def check_long_range(
    num_groups: int, causality: str, band_groups: int, values: str = "own", grouped: bool = True
) -> None:
    """The rules every long-range layer follows, whatever its kind (``kinds.LongRangePlan`` adds the kind's own);
    ``grouped``: the layer gathers its groups into --cluster-groups runs in the strict mode (cluster, LSH)."""
    check_choice("--cluster-causality", causality, CAUSALITY_CHOICES)
    check_choice("--long-range-values", values, LONG_RANGE_VALUE_CHOICES)
    if values == "next" and causality != "strict":
        raise ValueError(
            f"--long-range-values next needs long-range layers with --cluster-causality strict, got --cluster-causality"
            f" {causality}"
        )
    if num_groups < 1:
        raise ValueError(f"--num-clusters must be positive, got {num_groups}")
    if band_groups < 1:
        raise ValueError(f"--cluster-groups must be positive (or 0 for the default), got {band_groups}")
    if grouped and causality == "strict" and band_groups > num_groups:
        # a group is a run of neighbouring clusters: more groups than clusters leaves groups empty, and the
        # attention pattern is not the one asked for
        raise ValueError(
            f"--cluster-groups {band_groups} must not exceed --num-clusters ({num_groups}): every group is a run of "
            "at least one cluster (0, the default, is capped at --num-clusters)"
        )


def parse_layer_list(spec: str, num_layers: int, flag: str = "--long-range-layers") -> frozenset[int]:
    """'11,15' -> {11, 15}; every entry must be a layer number in 1..num_layers, named once."""
    try:
        numbers = [int(item) for item in str(spec).replace(" ", "").split(",") if item]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated layer numbers like '11,15', got {spec!r}") from None
    layers = frozenset(numbers)
    if len(layers) < len(numbers):
        repeated = sorted({i for i in numbers if numbers.count(i) > 1})
        raise ValueError(f"{flag} {spec!r} names layer(s) {repeated} more than once: a layer is long-range once")
    bad = sorted(i for i in layers if not 1 <= i <= num_layers)
    if bad:
        raise ValueError(f"{flag} {spec!r}: layer(s) {bad} outside 1..{num_layers} (layers are numbered from 1)")
    return layers
