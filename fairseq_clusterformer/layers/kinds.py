"""The long-range kinds ``--long-range-layer`` selects, one row each in ``KINDS``, and a model's ``LongRangePlan``
(which layers run which kind), checked when it is made.

A kind is a ``SortedWindowLayer`` subclass, whose ``kind`` is the flag's value and whose ``group_ids`` says which
tokens share a window, and its row here. Everything else reads the rows: the flags' choices and help (the language
model's and the QA model's), the plan's checks, ``layers.build``, the settings a resumed checkpoint must agree on,
the recipes (their flags refuse an unknown kind), the benchmarks' variants and the tables' labels, and the tests'
parametrisations. An unknown kind is refused with the known ones named.

What a row's class is decides how it is built and what it takes part in:
- a ``ContentGroupedLayer`` (cluster, LSH) groups tokens by content into ``--num-clusters`` groups, which the strict
  mode gathers into ``--cluster-groups`` runs of neighbouring groups; it is built as
  ``layer(settings, num_clusters, causality, num_band_groups, values, stream=)``; qa-reach measures where its far keys
  lie. Any other kind takes its groups from positions (sparse) and is built as ``layer(settings, causality, values)``;
- a ``ClusterFormerLayer`` has centroids: the K-Means refresh finds it by its class and fits them.

Built-in kinds are rows of the literal below. ``register_kind`` adds one at run time (a plug-in, a test): the QA
model's ``--long-range-layer`` reads the rows when its parser is built, so it offers the new kind; the language
model's is a fairseq ``ChoiceEnum``, fixed when ``lm/model.py`` is imported, so a kind the LM should offer is a row
here.
"""

from __future__ import annotations

from dataclasses import dataclass

from fairseq_clusterformer.layers.baselines import LSHLayer, StridedSparseLayer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.hybrid import (
    HybridClusterFormerLayer,
    HybridLongRange,
    HybridLSHLayer,
    HybridSparseLayer,
)
from fairseq_clusterformer.layers.settings import (
    LONG_RANGE_MODE_CHOICES,
    LayerSettings,
    check_choice,
    check_long_range,
)
from fairseq_clusterformer.layers.sorted_window import ContentGroupedLayer, SortedWindowLayer

# the flag's value for sliding windows at every position: no long-range layer, so no row
NO_LONG_RANGE = "none"
NO_LONG_RANGE_HELP = "sliding window everywhere (the paper's baselines)"


@dataclass(frozen=True)
class LongRangeKind:
    layer: type[SortedWindowLayer]  # --long-range-mode replace (the paper)
    hybrid: type[HybridLongRange] | None  # --long-range-mode hybrid (``layers.hybrid``); None: the kind has none
    title: str  # the kind in words, as the tables name a run ("one LSH layer, 6")
    help: str  # what --long-range-layer's help says of it

    @property
    def name(self) -> str:
        return self.layer.kind

    @property
    def grouped(self) -> bool:
        """Content groups of --num-clusters, gathered into --cluster-groups in the strict mode (cluster, LSH)."""
        return issubclass(self.layer, ContentGroupedLayer)

    @property
    def uses_clusters(self) -> bool:
        """Centroids that the K-Means refresh fits: the refresh finds the layers by this same class."""
        return issubclass(self.layer, ClusterFormerLayer)


KINDS: dict[str, LongRangeKind] = {
    row.name: row
    for row in (
        LongRangeKind(ClusterFormerLayer, HybridClusterFormerLayer, "Cluster-Former", "Cluster-Former"),
        LongRangeKind(LSHLayer, HybridLSHLayer, "LSH", "Reformer-style LSH buckets"),
        LongRangeKind(
            StridedSparseLayer,
            HybridSparseLayer,
            "sparse",
            "attention across windows at the same offset (Sparse Transformer's strided pattern)",
        ),
    )
}


def register_kind(row: LongRangeKind) -> None:
    """Add a kind after import (see the module's docstring for what sees it)."""
    if row.name in KINDS or row.name == NO_LONG_RANGE:
        raise ValueError(f"--long-range-layer {row.name!r} is taken: the kinds are {long_range_choices()}")
    KINDS[row.name] = row


def long_range_choices() -> tuple[str, ...]:
    """The values of --long-range-layer: every kind, then sliding windows everywhere."""
    return (*KINDS, NO_LONG_RANGE)


def long_range_help() -> str:
    kinds = [f"'{name}' = {row.help}" for name, row in KINDS.items()]
    return f"what the long-range layers run: {', '.join([*kinds, f'{NO_LONG_RANGE!r} = {NO_LONG_RANGE_HELP}'])}"


def long_range_kind(name: str) -> LongRangeKind:
    """The row of kind ``name``; an unknown name is refused, naming the kinds."""
    check_choice("--long-range-layer", name, long_range_choices())
    if name == NO_LONG_RANGE:
        raise ValueError(f"--long-range-layer {NO_LONG_RANGE} builds no long-range layer: it has no kind")
    return KINDS[name]


def is_grouped(name: str) -> bool:
    """Whether kind ``name`` reads --num-clusters and --cluster-groups (False for 'none' and unknown names)."""
    return name in KINDS and KINDS[name].grouped


@dataclass(frozen=True)
class LongRangePlan:
    """Which layers are long-range, and what they run."""

    layers: frozenset[int]  # 1-based layer numbers, as the paper counts
    kind: str = "cluster"
    num_clusters: int = 512
    causality: str = "strict"
    # strict causality: groups of neighbouring clusters (or LSH buckets) a token's keys come from
    band_groups: int = 1
    values: str = "own"
    mode: str = "replace"

    def __post_init__(self) -> None:
        check_choice("--long-range-layer", self.kind, long_range_choices())
        if self.values == "next" and self.kind == NO_LONG_RANGE:
            raise ValueError(
                f"--long-range-values next needs long-range layers (--long-range-layer {', '.join(KINDS)}) with "
                f"--cluster-causality strict, got --long-range-layer {self.kind}"
            )
        grouped = is_grouped(self.kind)
        check_long_range(self.num_clusters, self.causality, self.band_groups, self.values, grouped)
        if grouped:
            KINDS[self.kind].layer.check_num_groups(self.num_clusters)
        check_choice("--long-range-mode", self.mode, LONG_RANGE_MODE_CHOICES)
        hybrids = [name for name, row in KINDS.items() if row.hybrid is not None]
        if self.mode == "hybrid" and self.kind not in hybrids:
            raise ValueError(
                "--long-range-mode hybrid adds a long-range attention beside the sliding window: it needs "
                f"--long-range-layer {', '.join(hybrids)}, got --long-range-layer {self.kind}"
            )
        if not self.layers and self.kind != NO_LONG_RANGE:
            raise ValueError(
                f"--long-range-layers is empty, so no layer would run --long-range-layer {self.kind}: name the "
                f"long-range layers (e.g. '11,15'), or say --long-range-layer {NO_LONG_RANGE} for sliding windows "
                "everywhere"
            )


def settings_by_flag(settings: LayerSettings, plan: LongRangePlan, role: str) -> dict[str, object]:
    """What the layers compute, by the flag that sets it (``role``: "decoder" for the LM's flags, "encoder" for QA's):
    what a resumed checkpoint must agree on. Dropouts are left out: they regularise training, the trained function
    is the same, and changing them for the rest of a run is a choice a user may make."""
    values: dict[str, object] = {
        f"--{role}-embed-dim": settings.embed_dim,
        f"--{role}-ffn-embed-dim": settings.ffn_dim,
        f"--{role}-attention-heads": settings.heads,
        f"--{role}-normalize-before": settings.normalize_before,
        "--activation-fn": settings.activation_fn,
        "--window-size": settings.window_size,
        "--window-stride": settings.window_stride,
        "--window-merge": settings.window_merge,
        "--sliding-windows": settings.sliding_windows,
        "--long-range-layer": plan.kind,
    }
    if plan.kind != NO_LONG_RANGE:  # sliding windows everywhere: the long-range settings change nothing
        values["--long-range-layers"] = ",".join(map(str, sorted(plan.layers)))
        values["--cluster-causality"] = plan.causality
        values["--long-range-values"] = plan.values
        values["--long-range-mode"] = plan.mode
    if is_grouped(plan.kind):  # positional groups (sparse) have no clusters
        values["--num-clusters"] = plan.num_clusters
        values["--cluster-groups"] = plan.band_groups
    return values
