"""The Cluster-Former layer (paper section 3.2).

B = batch, T = tokens, C = channels, P = clusters.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.sorted_window import ContentGroupedLayer
from fairseq_clusterformer.layers.streams import stream_generator
from fairseq_clusterformer.ops.cluster_groups import uniform_shares
from fairseq_clusterformer.ops.clustering import assign_clusters, cluster_size_entropy
from fairseq_clusterformer.ops.kmeans import random_ordered_centroids

logger = logging.getLogger(__name__)


class Float32Buffers(nn.Module):
    """Keeps the buffers named in ``float32_buffers`` float32 through ``.half()``, ``.bfloat16()`` and ``.to(dtype)``
    (they still follow the module to its device).

    The group assignment computes in float32; a centroid or a hash direction rounded to half precision once would
    put tokens into other clusters than the float32 model does, and fairseq's ``--fp16`` calls ``model.half()``.
    """

    float32_buffers: tuple[str, ...] = ()

    def _apply(self, fn, *args, **kwargs):
        # *args: torch >= 2.1 passes ``recurse``; the torch 2.0 of the official fairseq 0.12.2 set-up does not
        before = {name: self._buffers[name] for name in self.float32_buffers if self._buffers.get(name) is not None}
        result = super()._apply(fn, *args, **kwargs)
        for name, original in before.items():
            converted = self._buffers[name]
            if converted.dtype != original.dtype:
                # the untouched original, not the rounded copy cast back: bit for bit the float32 values
                self._buffers[name] = original.to(converted.device)
        return result


class ClusterFormerLayer(Float32Buffers, ContentGroupedLayer):
    """Sort the states by their nearest centroid, run the layer on windows of the sorted sequence, unsort
    (``forward``)."""

    kind = "cluster"
    float32_buffers = ("centroids", "shares")
    # set by K-Means, not learned: a model average (fairseq's --store-ema) takes them from the live model as they are
    ema_copies = ("centroids", "shares", "refreshes")

    def __init__(
        self,
        settings: LayerSettings,
        num_clusters: int,
        causality: str = "strict",
        num_band_groups: int = 1,
        values: str = "own",
        stream: int = 0,
    ) -> None:
        super().__init__(settings, num_clusters, causality, num_band_groups, values)
        self.num_clusters = num_clusters
        # a buffer, not a parameter: K-Means on the memory bank sets it, and checkpoints carry it. Drawn from the
        # layer's own stream (``stream``: its position in the model), not torch's global one, which the sliding-window
        # model of the same seed goes on to draw its QA heads and dropout masks from (``layers.streams``)
        initial = random_ordered_centroids(num_clusters, settings.embed_dim, stream_generator(stream))
        self.register_buffer("centroids", initial)
        # each cluster's share of the banked states at the last refresh: where the strict mode cuts its groups
        self.register_buffer("shares", uniform_shares(num_clusters))
        # how many K-Means refreshes these centroids have seen: a checkpoint says whether they were ever fitted
        self.register_buffer("refreshes", torch.zeros((), dtype=torch.long))
        # set by the memory bank that records this layer's training inputs (``refresh.layer_banks``, through a
        # forward pre-hook): training without one would never refresh the centroids
        self.banked = False
        self.last_cluster_entropy: Tensor | None = None
        self.named_unrefreshed = False  # a load of never-refreshed centroids was warned about

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """One Cluster-Former layer: states x (B x T x C; padding_mask B x T, True at pads) -> B x T x C.

        Every model: ``cluster_ids`` gives each state its nearest centroid (eq. 4); ``attend``
        (``layers/sorted_window.py``) stable-sorts the tokens by it and takes one of two paths, both through
        ``ops.clustering.sort_window_unsort`` (sort, window, unsort) and ``ops.window_scheme.WindowScheme``:

        - the language model's default, ``--cluster-causality strict``, takes the **band** path
          (``WindowedTransformerLayer.run_band``, ``layers/windowed.py``). It is not the paper's windowing: each
          token attends to itself and its ``l - 1`` most recent predecessors within its group of neighbouring
          clusters (groups cut from the centroid order by the clusters' shares; two groupings, one per half of the
          heads), so what it sees never depends on later tokens. No window overlaps, nothing is averaged.
        - ``--cluster-causality paper`` and the QA encoder (bidirectional) take the paper's **windows** path
          (``run_windows``): windows of length ``l`` every ``m`` tokens of the sorted sequence (eq. 5), the
          transformer layer on each (eq. 6; causal masks compare original positions), unsorted and the overlaps
          averaged (eq. 7-8). In the LM this leaks the future: a token's window moves with the count of later tokens
          of lower clusters.

        A fixed-window layer (``SlidingWindowLayer``, ``layers/windowed.py``) runs the same ``run_windows`` (or
        ``run_band`` for ``--sliding-windows band``) with no sort. ``--long-range-mode hybrid`` (the QA encoder
        only) adds this attention beside the sliding window's (``layers/hybrid.py``).
        """
        out, ids = self.attend(x, padding_mask)
        self.observe(x, padding_mask, ids)
        return out

    def cluster_ids(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """B x T cluster ids (pads get P)."""
        return assign_clusters(x, self.centroids, padding_mask)

    group_ids = cluster_ids

    def cluster_shares(self) -> Tensor:
        return self.shares

    def observe(self, x: Tensor, padding_mask: Tensor | None, ids: Tensor) -> None:
        if self.training:
            self.last_cluster_entropy = cluster_size_entropy(ids, self.num_clusters, padding_mask)

    @torch.no_grad()
    def set_centroids(self, centroids: Tensor, shares: Tensor | None = None) -> None:
        """Install new (already greedily ordered) centroids, P x C, with each one's share of the banked states
        (P,; None = equal shares)."""
        if centroids.shape != self.centroids.shape:
            expected = tuple(self.centroids.shape)
            raise ValueError(f"new centroids have shape {tuple(centroids.shape)}, expected {expected}")
        if shares is not None and shares.shape != self.shares.shape:
            expected = tuple(self.shares.shape)
            raise ValueError(f"new cluster shares have shape {tuple(shares.shape)}, expected {expected}")
        self.centroids.copy_(centroids.to(self.centroids))
        self.shares.copy_(uniform_shares(self.num_clusters) if shares is None else shares.to(self.shares))
        self.update_groups()
        self.refreshes += 1

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors):
        saved = state_dict.get(prefix + "centroids")
        if saved is not None and saved.shape != self.centroids.shape:
            raise ValueError(
                f"checkpoint centroids {prefix}centroids have shape {tuple(saved.shape)} but the model expects "
                f"{tuple(self.centroids.shape)}: --num-clusters ({self.num_clusters}) or the embedding dim "
                "differs from the checkpoint's"
            )
        if saved is not None and prefix + "shares" not in state_dict:
            # checkpoints written before the strict mode cut groups by cluster shares: equal shares
            state_dict[prefix + "shares"] = uniform_shares(self.num_clusters)
        refreshes = state_dict.get(prefix + "refreshes")
        if saved is not None and refreshes is None:
            # checkpoints written before the count existed: keep the model's own count, say nothing about it
            state_dict[prefix + "refreshes"] = self.refreshes.clone()
        elif refreshes is not None and not self.named_unrefreshed and int(refreshes) == 0:
            # once per layer: fairseq's EMA (--store-ema) loads the live model's state into its copy at every update
            self.named_unrefreshed = True
            logger.warning(
                f"{prefix}centroids were never refreshed by K-Means: the checkpoint was written before the first "
                "K-Means refresh, so this layer clusters with its random, greedily ordered initial centroids"
            )
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors)
        self.update_groups()
