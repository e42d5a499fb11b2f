"""Memory banks and the periodic K-Means refresh of the centroids (paper Algorithm 1).

Shared by every task whose model has Cluster-Former layers. N = states, C = model dim.

- Every rank banks its own states (its shard, ``layer_banks``): nothing crosses ranks in a training step. When a
  refresh snapshots the banks and before a checkpoint is saved, the shards merge into rank 0's bank in the order of
  their micro-batches, so rank 0's banks then equal those of one process that ran the ranks' micro-batches one after
  another, and it alone saves them with the checkpoint. The other ranks keep each bank's counters and sampling
  generator, not its rows.
- A refresh snapshots the banks at the first micro-batch of a due update; rank 0 runs K-Means on the snapshot, in
  the training thread (`swap_delay` 0) or on a background thread, and the new centroids are broadcast and installed
  `swap_delay` updates later (at the latest when the next refresh is due) on every rank at the same update. A job
  not finished by then is waited for, and the wait is logged: never a result that depends on timing.
- Before the first update every rank takes rank 0's centroids (no reliance on equal seeds); a job still running
  when the process exits (training over, --no-save included) is joined and its error logged.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from fairseq.logging import metrics
from torch import nn

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import check_choice
from fairseq_clusterformer.ops.kmeans import KMEANS_BACKENDS, faiss_available
from fairseq_clusterformer.refresh.kmeans_job import LayerResult, PendingSwap, RefreshJob
from fairseq_clusterformer.refresh.layer_banks import LayerBanks
from fairseq_clusterformer.refresh.rank_exchange import broadcast_from_rank0, check_ranks_agree, world

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefreshSettings:
    memory_size: int = 100_000
    sample_per_batch: int = 0
    interval: int = 0  # updates between refreshes; 0 = at the start of every epoch after the first
    iters: int = 20
    backend: str = "auto"
    seed: int = 1
    swap_delay: int = 0  # updates between a snapshot and installing its centroids; 0 = synchronous

    def __post_init__(self) -> None:
        for flag, value, least in (
            ("--memory-size", self.memory_size, 1),
            ("--kmeans-iters", self.iters, 1),
            ("--cluster-update-interval", self.interval, 0),
            ("--memory-sample-per-batch", self.sample_per_batch, 0),
            ("--kmeans-swap-delay", self.swap_delay, 0),
        ):
            if value < least:
                raise ValueError(f"{flag} must be {'positive' if least else '>= 0'}, got {value}")
        check_choice("--kmeans-backend", self.backend, KMEANS_BACKENDS)


class CentroidRefresher:
    def __init__(self, settings: RefreshSettings) -> None:
        self.settings = settings
        self.layers: list[ClusterFormerLayer] = []
        self.banks = LayerBanks([], settings.memory_size, settings.sample_per_batch, settings.seed)
        self.refreshes_started = 0
        self.num_refreshes = 0  # refreshes that installed centroids in at least one layer (skipped ones do not count)
        self.last_refresh_update = -1
        self.last_refresh_epoch = 1
        self.epoch_refresh_due = False
        self.pending: PendingSwap | None = None
        self.last_refresh_seconds = 0.0  # K-Means time of the last installed refresh (rank 0)
        self.last_stall_seconds = 0.0  # training time the last refresh cost (snapshot + wait + broadcast)
        # per long-range layer, how far its last refresh moved its centroids (rank 0; floats: no device read to log)
        self.last_shift: dict[int, tuple[float, float]] = {}
        self._start_seconds = 0.0
        self.restored = False
        self._checked_resume = False
        self._saved: dict | None = None  # state loaded before `attach`

    def attach(self, model: nn.Module) -> None:
        """Give every Cluster-Former layer of ``model`` a memory bank that its training forward fills."""
        self.banks.detach()
        self.layers = [m for m in model.modules() if isinstance(m, ClusterFormerLayer)]
        s = self.settings
        # sharded: in a distributed run each rank banks its own states and nothing crosses ranks in a training step;
        # the shards merge into rank 0's bank when a refresh snapshots it and before a save (``LayerBanks.gather``)
        self.banks = LayerBanks(self.layers, s.memory_size, s.sample_per_batch, s.seed)
        if self.layers and self.settings.backend == "faiss" and not faiss_available():
            raise ValueError(
                "--kmeans-backend faiss needs faiss: pip install faiss-cpu (or use --kmeans-backend torch)"
            )
        if self._saved is not None:
            self.load_state_dict(self._saved)

    def commit(self, discard: bool = False) -> None:
        """After every micro-batch, on every rank (``LayerBanks.commit``)."""
        self.banks.commit(discard)

    # ---- the schedule ------------------------------------------------------------------------------------------

    def begin_epoch(self, epoch: int) -> None:
        if self.settings.interval == 0 and epoch > self.last_refresh_epoch:
            self.last_refresh_epoch = epoch
            self.epoch_refresh_due = True

    def due(self, update_num: int) -> bool:
        interval = self.settings.interval
        if interval == 0:
            return self.epoch_refresh_due
        return update_num > 0 and update_num % interval == 0 and update_num != self.last_refresh_update

    def before_step(self, update_num: int) -> None:
        """Call at the start of every micro-batch; acts once per update, the same way on every rank."""
        if not self.layers:  # sliding windows only, LSH or sparse: nothing is banked, so there is nothing to cluster
            return
        self._check_resume(update_num)
        start = time.perf_counter()
        if self.pending is not None and (update_num >= self.pending.install_at or self.due(update_num)):
            self._install(update_num, start)
        if self.due(update_num):
            self._start(update_num, start)

    def _check_resume(self, update_num: int) -> None:
        if self._checked_resume:
            return
        self._checked_resume = True
        self._broadcast_initial_centroids()
        if update_num > 0 and not self.restored and self.layers:
            logger.warning(
                f"training resumed at update {update_num} without the memory banks and the K-Means schedule: this "
                "fairseq does not hand task state back on resume (fairseq 0.12.2 has no Task.set_checkpoint_dict) or "
                "the checkpoint has none; the banks refill from now, and the resumed run is not exact"
            )

    @torch.no_grad()
    def _broadcast_initial_centroids(self) -> None:
        """Before the first update, on every rank: take rank 0's centroids (random ones, or a checkpoint's).

        Equal seeds would give every rank the same random centroids only as long as every rank draws the same random
        numbers before the model is built; this does not depend on that. Until the first refresh, ranks that
        clustered differently would train one model on different attention patterns."""
        _, size = world()
        if size == 1 or not self.layers:
            return
        for layer in self.layers:
            broadcast_from_rank0([layer.centroids, layer.shares])
            layer.update_groups()
        logger.info(f"initial centroids of {len(self.layers)} long-range layers broadcast from rank 0 to {size} ranks")

    def _start(self, update_num: int, start: float) -> None:
        self.last_refresh_update = update_num
        self.epoch_refresh_due = False
        seed = self.settings.seed + self.refreshes_started
        self.refreshes_started += 1
        self.banks.gather()  # every rank: the shards meet in rank 0's bank, which the job snapshots
        job = None
        if world()[0] == 0:
            clusters = [layer.num_clusters for layer in self.layers]
            s = self.settings
            # the centroids this refresh replaces, so that it can say how far it moved them (copies: the job may
            # run on a thread while training goes on)
            previous = [layer.centroids.detach().float().clone() for layer in self.layers]
            job = RefreshJob(self.banks.snapshots(), clusters, s.iters, seed, s.backend, previous)
        self.pending = PendingSwap(self.refreshes_started, update_num, update_num + self.settings.swap_delay, job)
        if self.settings.swap_delay == 0:
            self._install(update_num, start)
            return
        self.pending.start()
        self._start_seconds = time.perf_counter() - start
        logger.info(
            f"K-Means job {self.refreshes_started} started at update {update_num} on a snapshot of "
            f"{len(self.banks[0]) if self.banks else 0} states per layer; installs at update "
            f"{self.pending.install_at}"
        )

    @torch.no_grad()
    def _install(self, update_num: int, start: float) -> None:
        pending, self.pending = self.pending, None
        results = pending.results()
        waited = time.perf_counter() - start
        _, size = world()
        installed = 0
        for index, layer in enumerate(self.layers):
            result = results[index] if results is not None else None
            ok = torch.tensor(
                [float(result is not None and result.centroids is not None)], device=layer.centroids.device
            )
            centroids = layer.centroids.detach().float().clone()
            shares = layer.shares.detach().float().clone()
            if ok.item():
                centroids = result.centroids.to(centroids.device)
                if result.shares is not None:
                    shares = result.shares.to(shares.device)
            if size > 1:
                broadcast_from_rank0([ok, centroids, shares])  # rank 0's verdict: every rank counts alike
            if ok.item():
                layer.set_centroids(centroids, shares)
                installed += 1
            self._log_install(pending.number, index, layer, result, update_num)
        if size > 1:
            check_ranks_agree(self.layers, pending.number)
        # a refresh counts once it replaced some layer's centroids: one skipped everywhere (too few or too alike
        # banked states) left the model as it was, and the count that the logs and checkpoints show must say so
        if installed:
            self.num_refreshes += 1
        else:
            logger.warning(
                f"K-Means job {pending.number} (snapshot of update {pending.started_at}) installed no centroids: "
                f"not counted as a refresh ({self.num_refreshes} so far)"
            )
        self.last_refresh_seconds = sum(r.seconds for r in results) if results else 0.0
        self.last_stall_seconds = self._start_seconds + time.perf_counter() - start
        self._start_seconds = 0.0
        if self.settings.swap_delay > 0 and installed:
            logger.info(
                f"K-Means job {pending.number} (snapshot of update {pending.started_at}) installed at update "
                f"{update_num}: training waited {waited:.3f}s for it"
            )

    def _log_install(
        self, job: int, index: int, layer: ClusterFormerLayer, result: LayerResult | None, update: int
    ) -> None:
        if result is None:  # ranks other than 0 hold no results
            return
        done = f"{result.num_states} states, {result.seconds:.2f}s"
        if result.centroids is None:
            logger.warning(
                f"K-Means job {job}, long-range layer {index}: skipped at update {update} ({done}): "
                f"{result.skipped_because}; keeping the previous centroids"
            )
            return
        if result.nearest_cosine is not None and result.agreement is not None:
            self.last_shift[index] = (result.nearest_cosine, result.agreement)
        logger.info(
            f"K-Means refresh {self.num_refreshes + 1}, long-range layer {index}: {done} ({result.backend}), "
            f"{layer.num_clusters} clusters, installed at update {update}{result.shift_note()}"
        )

    # ---- checkpoints and logging -------------------------------------------------------------------------------

    @property
    def layer_refreshes(self) -> list[int]:
        """Per long-range layer, the refreshes that replaced its centroids: the layers' own ``refreshes`` buffers,
        which travel with the weights (read from the device: call it at a save or a log line, not in a step)."""
        return [int(layer.refreshes) for layer in self.layers]

    def summary(self) -> dict:
        """The few facts inference wants to know about the centroids (small; kept in fairseq's task_state)."""
        return {"num_refreshes": self.num_refreshes, "layer_refreshes": list(self.layer_refreshes)}

    def state_dict(self) -> dict:
        """Everything an exact resume needs; waits for a job in flight and saves its result, not its input."""
        pending = None if self.pending is None else self.pending.state_dict()
        return {
            "banks": self.banks.state_dict(),
            "refreshes_started": self.refreshes_started,
            "num_refreshes": self.num_refreshes,
            "last_refresh_update": self.last_refresh_update,
            "last_refresh_epoch": self.last_refresh_epoch,
            "epoch_refresh_due": self.epoch_refresh_due,
            "pending": pending,
        }

    def load_state_dict(self, state: dict) -> None:
        if not self.layers:  # fairseq may hand the state over before the model is built
            self._saved = state
            return
        self._saved = None
        self.banks.load_state_dict(state["banks"])
        names = ("refreshes_started", "num_refreshes", "last_refresh_update", "last_refresh_epoch", "epoch_refresh_due")
        for name in names:
            setattr(self, name, state[name])
        saved = state["pending"]
        self.pending = (
            None if saved is None else PendingSwap.from_state_dict(saved, self.refreshes_started, world()[0] == 0)
        )
        self.restored = True

    def log_stats(self) -> None:
        """Per training step: cluster-size entropy (bits) of the batch, bank fill and how far the last refresh moved
        the centroids (kmeans_cos / kmeans_ari) per long-range layer, and the K-Means time and training stall of the
        last refresh. Logged every step so no logging interval is empty."""
        for index, (layer, bank) in enumerate(zip(self.layers, self.banks)):
            if layer.last_cluster_entropy is not None:
                metrics.log_scalar(f"cluster_entropy_{index}", layer.last_cluster_entropy, weight=1, round=3)
            # device tensors: fairseq reads them when it logs, not in every step (a read here would stall a GPU)
            metrics.log_scalar(f"bank_{index}", bank.fill, weight=0, round=0)
            metrics.log_scalar(f"bank_nonfinite_{index}", bank.nonfinite_dropped, weight=0, round=0)
        for index, (cosine, agreement) in self.last_shift.items():
            metrics.log_scalar(f"kmeans_cos_{index}", cosine, weight=0, round=3)
            metrics.log_scalar(f"kmeans_ari_{index}", agreement, weight=0, round=3)
        if self.layers:
            metrics.log_scalar("kmeans_s", self.last_refresh_seconds, weight=0, round=3)
            metrics.log_scalar("kmeans_stall_s", self.last_stall_seconds, weight=0, round=3)
            metrics.log_scalar("kmeans_refreshes", self.num_refreshes, weight=0, round=0)


def check_refreshed_in_training(model: nn.Module) -> None:
    """Refuse to train Cluster-Former layers that no task refreshes (their memory banks are attached by
    ``CentroidRefresher.attach``): under fairseq's own language_modeling task the centroids would stay the random
    ones they were built with. Evaluation and generation never call this: it belongs in ``model.train()``."""
    orphans = [m for m in model.modules() if isinstance(m, ClusterFormerLayer) and not m.banked]
    if orphans:
        raise ValueError(
            f"this model has {len(orphans)} Cluster-Former layer(s) (--long-range-layer cluster) but the task does "
            "not refresh their centroids (no memory bank, no K-Means): they would train on random centroids. Train "
            "with --task clusterformer_lm (QA: --task clusterformer_qa), or use --long-range-layer lsh, sparse or "
            "none, which have no centroids. Evaluation is not affected: fairseq-eval-lm works without --task"
        )
