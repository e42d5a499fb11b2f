"""The Cluster-Former layer (paper section 3.2).

B = batch, T = tokens, C = channels, P = clusters.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fairseq_clusterformer.modules.windowed_layer import LayerSettings, WindowedTransformerLayer
from fairseq_clusterformer.ops.clustering import (
    assign_clusters,
    cluster_size_entropy,
    stable_sort,
)
from fairseq_clusterformer.ops.kmeans import random_ordered_centroids
from fairseq_clusterformer.ops.window_scheme import WindowScheme

CAUSALITY_CHOICES = ("strict", "paper")

# receives a layer's input states (B x T x C, detached) and its padding mask (B x T or None)
StateSink = Callable[[Tensor, "Tensor | None"], None]


class ClusterFormerLayer(WindowedTransformerLayer):
    """Sort the states by their nearest centroid, run the layer on windows of the sorted sequence, unsort.

    ``causality`` only matters for a causal (LM) layer: ``paper`` windows the sorted sequence as the
    paper does (a token's window depends on how many tokens of lower clusters exist, later ones
    included); ``strict`` lets every token see itself and its ``l - 1`` most recent predecessors in
    its own cluster, which depends on the past alone.
    """

    def __init__(self, settings: LayerSettings, num_clusters: int, causality: str = "strict") -> None:
        super().__init__(settings)
        if causality not in CAUSALITY_CHOICES:
            raise ValueError(f"--cluster-causality must be one of {CAUSALITY_CHOICES}, got {causality!r}")
        if num_clusters < 1:
            raise ValueError(f"--num-clusters must be positive, got {num_clusters}")
        self.num_clusters = num_clusters
        self.causality = causality
        # a buffer, not a parameter: K-Means on the memory bank sets it, and checkpoints carry it
        self.register_buffer("centroids", random_ordered_centroids(num_clusters, settings.embed_dim))
        self.state_sink: StateSink | None = None
        self.last_cluster_entropy: Tensor | None = None

    @property
    def band(self) -> bool:
        return self.settings.causal and self.causality == "strict"

    def cluster_ids(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """B x T cluster ids (pads get P)."""
        return assign_clusters(x, self.centroids, padding_mask)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        if self.training and self.state_sink is not None:
            self.state_sink(x.detach(), padding_mask)
        ids = self.cluster_ids(x, padding_mask)  # B x T
        sorted_ids, order = stable_sort(ids)  # B x T each
        if self.training:
            self.last_cluster_entropy = cluster_size_entropy(ids, self.num_clusters, padding_mask)
        scheme = WindowScheme(self.settings.window_size, self.settings.window_stride, x.size(1), band=self.band)
        return self.run_windows(x, scheme, padding_mask, order=order, ids=sorted_ids)

    @torch.no_grad()
    def set_centroids(self, centroids: Tensor) -> None:
        """Install new (already greedily ordered) centroids, P x C."""
        if centroids.shape != self.centroids.shape:
            expected = tuple(self.centroids.shape)
            raise ValueError(f"new centroids have shape {tuple(centroids.shape)}, expected {expected}")
        self.centroids.copy_(centroids.to(self.centroids))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors):
        saved = state_dict.get(prefix + "centroids")
        if saved is not None and saved.shape != self.centroids.shape:
            raise ValueError(
                f"checkpoint centroids {prefix}centroids have shape {tuple(saved.shape)} but the model expects "
                f"{tuple(self.centroids.shape)}: --num-clusters ({self.num_clusters}) or the embedding dim "
                "differs from the checkpoint's"
            )
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors)
