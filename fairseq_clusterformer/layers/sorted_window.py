"""The path every long-range layer shares: group the tokens, stable-sort by group, run the layer on windows of the
sorted sequence, unsort (``SortedWindowLayer.attend``). The layer types differ only in how they assign groups (K-Means
centroids, LSH buckets, offsets); ``ContentGroupedLayer`` adds what the groups of clusters and buckets share.

B = batch, T = tokens, C = channels, P = groups, n = groupings (head sets) of the strict mode.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fairseq_clusterformer.layers.compiled import compilable
from fairseq_clusterformer.layers.flex import flex_band_forward, flex_windows_forward
from fairseq_clusterformer.layers.settings import LayerSettings, check_long_range
from fairseq_clusterformer.layers.windowed import StepCache, WindowedTransformerLayer
from fairseq_clusterformer.ops.cluster_groups import band_group_ids, cluster_to_group, uniform_shares
from fairseq_clusterformer.ops.clustering import sorted_positions, stable_sort
from fairseq_clusterformer.ops.step_cache import empty_rows
from fairseq_clusterformer.ops.window_scheme import WindowScheme


class SortedWindowLayer(WindowedTransformerLayer):
    """A windowed layer over the sequence sorted by ``group_ids``.

    ``causality`` only matters for a causal (LM) layer: ``paper`` windows the sorted sequence as the paper does
    (a token's window depends on how many tokens of lower groups exist, later ones included); ``strict`` lets
    every token see itself and its ``l - 1`` most recent predecessors in its band group (``band_groups``, one of
    ``num_band_groups`` groups of consecutive group ids; the sparse baseline's groups are its own), a set
    that depends on the past alone (provided a token's group depends on that token alone, as it does for every
    subclass).

    ``values`` (strict mode only): ``own`` (the paper) gives every key its own value; ``next`` gives every earlier
    key the value of the token that followed it (the query itself keeps its own). A query then reads what came
    after the earlier tokens that resemble it, which a causal model cannot otherwise reach through clusters: the
    state that resembles the query (an earlier occurrence of the same token) was computed before the token that
    followed it, and the state holding that token does not resemble the query.
    """

    kind: str  # what --long-range-layer calls this layer

    def __init__(
        self,
        settings: LayerSettings,
        num_groups: int,
        causality: str = "strict",
        num_band_groups: int = 1,
        values: str = "own",
    ) -> None:
        super().__init__(settings)
        # the model's LongRangePlan ran these checks already; a layer built on its own runs them here
        check_long_range(num_groups, causality, num_band_groups, values)
        self.check_num_groups(num_groups)
        self.num_groups = num_groups
        self.causality = causality
        self.values = values

    @classmethod
    def check_num_groups(cls, num_groups: int) -> None:
        """Refuse a group count this kind cannot make (``kinds.LongRangePlan`` asks it of --num-clusters)."""

    @property
    def band(self) -> bool:
        return self.settings.causal and self.causality == "strict"

    def group_ids(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """B x T group ids in 0..P-1, pads at P."""
        raise NotImplementedError

    def band_groups(self, ids: Tensor, padding_mask: Tensor | None) -> Tensor:
        """n x B x T: the groups whose recent past the strict mode attends to, one row per head set (pads last).
        By default the groups themselves, for every head (the sparse baseline's exact strided pattern)."""
        return ids[None]

    def step_group_ids(self, x: Tensor, position: int) -> Tensor:
        """B x 1 group ids of one appended token (x: B x 1 x C) at ``position``; a token's group depends on that
        token alone, so this is ``group_ids`` of the token by itself (the sparse baseline also needs its position)."""
        return self.group_ids(x, None)

    def band_group_count(self) -> int:
        """How many values ``band_groups`` gives a real token (one per group, per grouping)."""
        return self.num_groups

    @property
    def cacheable(self) -> bool:
        # paper causality windows the sorted sequence: a later token of a lower group moves earlier tokens' windows
        return self.band

    def forward_step(self, x: Tensor, cache: StepCache, position: int) -> tuple[Tensor, StepCache]:
        """The strict mode for one appended token (x: B x 1 x C): the cache holds, per head set and group, the keys
        and values of the group's ``l - 1`` most recent tokens (``ops.step_cache``)."""
        if not self.band:
            raise ValueError("only --cluster-causality strict layers can be cached (paper mode is not causal)")
        groups = self.band_groups(self.step_group_ids(x, position), None)[:, :, 0].t()  # B x n
        sets = groups.size(1)
        if not cache:
            width = x.size(-1) // sets
            rows = sets * self.band_group_count()  # read from the group table once, not at every step
            kv, count = empty_rows(x.size(0), rows, self.settings.window_size - 1, width, x)
            cache = {"kv": kv, "count": count}
        per_set = cache["count"].size(1) // sets
        rows = groups + torch.arange(sets, device=x.device) * per_set  # B x n: the row of (set j, group)
        return self.step_band(x, cache, rows, next_values=self.values == "next")

    def attention_layouts(self, ids: Tensor, padding_mask: Tensor | None) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Who attends to whom, for statistics (the inspector, the reach benchmark), one entry per head set:
        (query positions B x K x Lq, key positions B x K x Lk, mask B x K x Lq x Lk), in original positions, with
        padded slots outside [0, T). ids: B x T, the layer's ``group_ids``."""
        s = self.settings
        valid = torch.ones_like(ids, dtype=torch.bool) if padding_mask is None else ~padding_mask  # B x T
        groups = self.band_groups(ids, padding_mask) if self.band else ids[None]  # n x B x T
        layouts = []
        for grouping in groups:  # statistics only, not the forward pass
            sorted_ids, order = stable_sort(grouping)  # B x T each
            # the positions and validity ``sort_window_unsort`` gives the forward's windows
            positions, sorted_valid = sorted_positions(valid, order)  # B x T each
            scheme = WindowScheme(s.window_size, s.window_stride, ids.size(1), band=self.band)
            allowed = scheme.mask(positions, sorted_valid, s.causal, sorted_ids)  # B x K x Lq x Lk
            slots = scheme.slot_positions(positions)  # B x Tp original positions of the sorted slots
            layouts.append((scheme.queries(slots), scheme.keys(slots, -1), allowed))
        return layouts

    def observe(self, x: Tensor, padding_mask: Tensor | None, ids: Tensor) -> None:
        """Called with every forward's input and group ids, outside the compiled ``attend`` (the Cluster-Former layer
        keeps the entropy of its cluster sizes for the logs here)."""

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """B x T x C -> B x T x C; ``ClusterFormerLayer.forward`` (``layers/cluster.py``) says which path each model
        takes."""
        out, ids = self.attend(x, padding_mask)
        self.observe(x, padding_mask, ids)
        return out

    @compilable
    def attend(self, x: Tensor, padding_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """The layer's output (B x T x C) and group ids (B x T): all of ``forward`` but ``observe``, a pure function
        of its inputs, which ``--compile-layers`` compiles whole. Two paths (``--attention-backend flex`` computes
        each in one FlexAttention call, ``layers/flex.py``):

        - band (a causal layer in strict mode, the LM's default): ``run_band``, each token and its ``l - 1`` most
          recent predecessors in its group, one sort per head set;
        - windows (paper mode, and every bidirectional layer: the QA encoder): ``run_windows`` on the sequence
          sorted by group id, the paper's overlapping windows.
        """
        ids = self.group_ids(x, padding_mask)  # B x T
        if self.band:
            groups = self.band_groups(ids, padding_mask)  # n x B x T
            sorted_groups, orders = stable_sort(groups.flatten(0, 1))  # (n*B) x T each: one sort for every set
            orders, sorted_groups = orders.view_as(groups), sorted_groups.view_as(groups)  # n x B x T each
            if self.attention_backend == "flex":
                return flex_band_forward(self, x, padding_mask, orders, sorted_groups), ids
            return self.run_band(x, padding_mask, orders, sorted_groups, next_values=self.values == "next"), ids
        _, order = stable_sort(ids)  # B x T
        if self.attention_backend == "flex":
            return flex_windows_forward(self, x, padding_mask, order), ids
        scheme = WindowScheme(self.settings.window_size, self.settings.window_stride, x.size(1))
        return self.run_windows(x, scheme, padding_mask, order=order), ids


class ContentGroupedLayer(SortedWindowLayer):
    """A sorted-window layer whose group ids come from the states' content and are ordered so that neighbouring ids
    are alike: Cluster-Former's clusters (greedily ordered centroids) and LSH's buckets. Its strict mode attends
    within groups of neighbouring ids, cut at fixed points of that order, balanced by each id's share of the tokens
    (``ops.cluster_groups``). Two groupings, shifted by half a group, serve the two halves of the heads, so that no
    cluster is at a group boundary for every head."""

    def __init__(
        self, settings: LayerSettings, num_groups: int, causality: str, num_band_groups: int, values: str = "own"
    ) -> None:
        super().__init__(settings, num_groups, causality, num_band_groups, values)
        self.num_band_groups = num_band_groups
        self.groupings = 2 if settings.heads % 2 == 0 else 1
        # cluster -> group per grouping (n x P); derived from the shares, so not saved: ``update_groups`` redoes it
        # whenever the shares change, which keeps host work and syncs out of the forward pass
        self.register_buffer("group_table", self._table(uniform_shares(num_groups)), persistent=False)
        self._group_count = self._count(self.group_table)

    def cluster_shares(self) -> Tensor:
        """Expected share of the tokens per cluster (P,), which sets the group cut points."""
        return uniform_shares(self.num_groups)

    def _table(self, shares: Tensor) -> Tensor:
        return cluster_to_group(shares, self.num_band_groups, self.groupings)  # n x P

    @staticmethod
    def _count(table: Tensor) -> int:
        """How many group ids the table gives (its values run 0..G: the shifted groupings have one group more)."""
        return int(table.max()) + 1 if table.numel() else 0

    def update_groups(self) -> None:
        table = self._table(self.cluster_shares())  # on the CPU, where ``cluster_to_group`` computes it
        # counted here, on the host copy, once per change of the shares: a forward or a generation step that read
        # the max of the device's table would wait for the GPU
        self._group_count = self._count(table)
        self.group_table = table.to(self.group_table.device)

    def band_groups(self, ids: Tensor, padding_mask: Tensor | None) -> Tensor:
        # pads one past the last group: the group count
        return band_group_ids(ids, self.group_table, padding_mask, self._group_count)  # n x B x T

    def band_group_count(self) -> int:
        return self._group_count
