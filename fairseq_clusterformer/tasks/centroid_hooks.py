"""The K-Means hook every Cluster-Former task shares: its flags and the fairseq task methods that drive it.

A task mixes ``CentroidRefreshHooks`` in before its fairseq base class (``class T(CentroidRefreshHooks,
LanguageModelingTask)``) and adds ``MemoryBankConfig`` to its config dataclass. No
``from __future__ import annotations`` here: fairseq reads the config field types at run time.
"""

from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum

from fairseq_clusterformer.modules.centroid_refresh import CentroidRefresher, RefreshSettings

KMEANS_BACKENDS = ("faiss", "torch")


@dataclass
class MemoryBankConfig:
    """The K-Means hook's flags; shared by every Cluster-Former task."""

    memory_size: int = field(
        default=100_000, metadata={"help": "states kept per long-range layer for K-Means (all ranks together)"}
    )
    cluster_update_interval: int = field(
        default=0, metadata={"help": "updates between centroid refreshes; 0 = at the start of every epoch"}
    )
    kmeans_iters: int = field(default=20, metadata={"help": "K-Means iterations per refresh"})
    memory_sample_per_batch: int = field(
        default=0, metadata={"help": "random states per batch and layer written to the bank; 0 = all"}
    )
    kmeans_backend: ChoiceEnum(KMEANS_BACKENDS) = field(
        default="faiss", metadata={"help": "faiss (GPU index when the model is on a GPU) or plain torch"}
    )


def refresh_settings(cfg) -> RefreshSettings:
    for flag, value in (
        ("--memory-size", cfg.memory_size),
        ("--kmeans-iters", cfg.kmeans_iters),
    ):
        if value < 1:
            raise ValueError(f"{flag} must be positive, got {value}")
    for flag, value in (
        ("--cluster-update-interval", cfg.cluster_update_interval),
        ("--memory-sample-per-batch", cfg.memory_sample_per_batch),
    ):
        if value < 0:
            raise ValueError(f"{flag} must be >= 0, got {value}")
    return RefreshSettings(
        memory_size=cfg.memory_size,
        sample_per_batch=cfg.memory_sample_per_batch,
        interval=cfg.cluster_update_interval,
        iters=cfg.kmeans_iters,
        backend=str(cfg.kmeans_backend),
        seed=cfg.seed,
    )


class CentroidRefreshHooks:
    """fairseq task methods that fill the memory banks in training and refresh the centroids.

    The subclass must call ``self.init_centroid_refresh(cfg)`` in its ``__init__``.
    """

    refresher: CentroidRefresher

    def init_centroid_refresh(self, cfg) -> None:
        self.refresher = CentroidRefresher(refresh_settings(cfg))

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        self.refresher.attach(model)
        return model

    def begin_epoch(self, epoch, model):
        super().begin_epoch(epoch, model)
        self.refresher.begin_epoch(epoch)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        # the first micro-batch of an update is the same moment on every rank: refresh there
        self.refresher.maybe_refresh(update_num)
        result = super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        self.refresher.log_stats()
        return result
