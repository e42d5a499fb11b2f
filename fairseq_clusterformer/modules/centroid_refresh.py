"""Memory banks and the periodic K-Means refresh of the centroids (paper Algorithm 1).

Shared by every task whose model has Cluster-Former layers. One bank per layer collects that layer's
input states during training; every ``interval`` updates (or at every epoch start) the banks of all
ranks are gathered, rank 0 runs spherical K-Means, orders the centroids greedily and broadcasts them,
so every rank installs identical centroids at the same update.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from fairseq.logging import metrics
from torch import Tensor, nn

from fairseq_clusterformer.modules.cluster_layer import ClusterFormerLayer
from fairseq_clusterformer.modules.memory_bank import MemoryBank
from fairseq_clusterformer.ops.kmeans import faiss_available, is_degenerate, order_centroids, spherical_kmeans

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefreshSettings:
    memory_size: int = 100_000
    sample_per_batch: int = 0
    interval: int = 0  # updates between refreshes; 0 = at the start of every epoch after the first
    iters: int = 20
    backend: str = "faiss"
    seed: int = 1


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_rows(rows: Tensor) -> Tensor:
    """Concatenate every rank's N_r x C rows, in rank order, on every rank (N_r may differ)."""
    rank, world = _world()
    if world == 1:
        return rows
    count = torch.tensor([rows.size(0)], device=rows.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    longest = int(max(c.item() for c in counts))
    padded = rows.new_zeros(longest, rows.size(1))
    padded[: rows.size(0)] = rows
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([part[: int(c.item())] for part, c in zip(parts, counts)])


class CentroidRefresher:
    def __init__(self, settings: RefreshSettings) -> None:
        self.settings = settings
        self.layers: list[ClusterFormerLayer] = []
        self.banks: list[MemoryBank] = []
        self.last_refresh_update = -1
        self.num_refreshes = 0
        self.last_refresh_seconds = 0.0

    def attach(self, model: nn.Module) -> None:
        """Give every Cluster-Former layer of ``model`` a memory bank that its training forward fills."""
        self.layers = [m for m in model.modules() if isinstance(m, ClusterFormerLayer)]
        _, world = _world()
        # --memory-size counts the states of all ranks together: each rank keeps its share
        capacity = math.ceil(self.settings.memory_size / world)
        self.banks = []
        for index, layer in enumerate(self.layers):
            if layer.num_clusters > self.settings.memory_size:
                raise ValueError(
                    f"--num-clusters ({layer.num_clusters}) is larger than --memory-size ({self.settings.memory_size}):"
                    " K-Means needs at least one state per cluster"
                )
            bank = MemoryBank(capacity, self.settings.sample_per_batch, seed=self.settings.seed + index)
            layer.state_sink = self._sink(bank)
            self.banks.append(bank)

    @staticmethod
    def _sink(bank: MemoryBank):
        def collect(states: Tensor, padding_mask: Tensor | None) -> None:
            flat = states.reshape(-1, states.size(-1))  # (B*T) x C
            if padding_mask is not None:
                flat = flat[~padding_mask.reshape(-1)]  # pads never enter the bank
            bank.add(flat)

        return collect

    def due(self, update_num: int) -> bool:
        interval = self.settings.interval
        return interval > 0 and update_num > 0 and update_num % interval == 0 and update_num != self.last_refresh_update

    def maybe_refresh(self, update_num: int) -> None:
        """Call at the start of every train step: refreshes once when ``update_num`` reaches the interval."""
        if self.due(update_num):
            self.last_refresh_update = update_num
            self.refresh()

    def check_backend(self) -> None:
        """Fail before training starts, not at the first refresh, when the K-Means backend is missing."""
        if self.layers and self.settings.backend == "faiss" and not faiss_available():
            raise ValueError(
                "--kmeans-backend faiss needs faiss: pip install faiss-cpu (or use --kmeans-backend torch)"
            )

    def begin_epoch(self, epoch: int) -> None:
        self.check_backend()
        if self.settings.interval == 0 and epoch > 1:
            self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute every layer's centroids from the banks of all ranks; identical on every rank."""
        rank, world = _world()
        for index, (layer, bank) in enumerate(zip(self.layers, self.banks)):
            start = time.perf_counter()
            device = layer.centroids.device
            local = bank.contents() if len(bank) else layer.centroids.new_zeros(0, layer.centroids.size(1))
            states = gather_rows(local.to(device=device, dtype=torch.float32))  # N x C, all ranks
            ok = torch.ones(1, device=device)
            centroids = layer.centroids.detach().clone().float()
            if rank == 0:
                if states.size(0) < layer.num_clusters or is_degenerate(states, layer.num_clusters):
                    logger.warning(
                        f"long-range layer {index}: {states.size(0)} banked states are too few or too alike for "
                        f"{layer.num_clusters} clusters; keeping the previous centroids"
                    )
                    ok.zero_()
                else:
                    use_gpu = device.type == "cuda"
                    fresh = spherical_kmeans(
                        states, layer.num_clusters, self.settings.iters, self.settings.seed + self.num_refreshes,
                        self.settings.backend, use_gpu=use_gpu,
                    )
                    centroids = order_centroids(fresh).to(device)
            if world > 1:
                dist.broadcast(ok, src=0)
                dist.broadcast(centroids, src=0)
            if ok.item():
                layer.set_centroids(centroids)
            seconds = time.perf_counter() - start
            self.last_refresh_seconds = seconds
            logger.info(
                f"K-Means refresh {self.num_refreshes + 1}, long-range layer {index}: {states.size(0)} states, "
                f"{layer.num_clusters} clusters, {seconds:.2f}s ({self.settings.backend})"
            )
        self.num_refreshes += 1

    def log_stats(self) -> None:
        """Per training step: cluster-size entropy (bits) of the batch and bank fill per long-range layer, and the
        duration of the last K-Means refresh. Logged every step so that no logging interval shows an empty meter."""
        for index, (layer, bank) in enumerate(zip(self.layers, self.banks)):
            if layer.last_cluster_entropy is not None:
                metrics.log_scalar(f"cluster_entropy_{index}", layer.last_cluster_entropy, weight=1, round=3)
            metrics.log_scalar(f"bank_{index}", len(bank), weight=0, round=0)
        if self.layers:
            metrics.log_scalar("kmeans_s", self.last_refresh_seconds, weight=0, round=3)
            metrics.log_scalar("kmeans_refreshes", self.num_refreshes, weight=0, round=0)
