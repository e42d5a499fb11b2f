"""The path every long-range layer shares: group the tokens, stable-sort by group, run the layer on windows of the
sorted sequence, unsort. The layer types differ only in how they assign groups (K-Means centroids, LSH, offsets).

B = batch, T = tokens, C = channels, P = groups.
"""

from __future__ import annotations

from torch import Tensor

from fairseq_clusterformer.modules.windowed_layer import LayerSettings, WindowedTransformerLayer
from fairseq_clusterformer.ops.clustering import stable_sort
from fairseq_clusterformer.ops.window_scheme import WindowScheme

CAUSALITY_CHOICES = ("strict", "paper")


class SortedWindowLayer(WindowedTransformerLayer):
    """A windowed layer over the sequence sorted by ``group_ids``.

    ``causality`` only matters for a causal (LM) layer: ``paper`` windows the sorted sequence as the paper does
    (a token's window depends on how many tokens of lower groups exist, later ones included); ``strict`` lets
    every token see itself and its ``l - 1`` most recent predecessors in its own group, which depends on the
    past alone (provided a token's group depends on that token alone, as it does for every subclass).
    """

    def __init__(self, settings: LayerSettings, num_groups: int, causality: str = "strict") -> None:
        super().__init__(settings)
        if causality not in CAUSALITY_CHOICES:
            raise ValueError(f"--cluster-causality must be one of {CAUSALITY_CHOICES}, got {causality!r}")
        if num_groups < 1:
            raise ValueError(f"--num-clusters must be positive, got {num_groups}")
        self.num_groups = num_groups
        self.causality = causality

    @property
    def band(self) -> bool:
        return self.settings.causal and self.causality == "strict"

    def group_ids(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """B x T group ids in 0..P-1, pads at P."""
        raise NotImplementedError

    def observe(self, x: Tensor, padding_mask: Tensor | None, ids: Tensor) -> None:
        """Called with every forward's input and ids before the sort (the cluster layer fills its bank here)."""

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        ids = self.group_ids(x, padding_mask)  # B x T
        self.observe(x, padding_mask, ids)
        sorted_ids, order = stable_sort(ids)  # B x T each
        scheme = WindowScheme(self.settings.window_size, self.settings.window_stride, x.size(1), band=self.band)
        return self.run_windows(x, scheme, padding_mask, order=order, ids=sorted_ids)
