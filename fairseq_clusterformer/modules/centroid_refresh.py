"""Memory banks and the periodic K-Means refresh of the centroids (paper Algorithm 1).

Shared by every task whose model has Cluster-Former layers. L = long-range layers, N = states, C = model dim.

- Every rank holds the same, global banks: after each micro-batch the states every rank staged are exchanged
  (only the sampled ones, see `--memory-sample-per-batch`) and appended in rank order. So the banks equal those of one
  process that ran the ranks' micro-batches one after another, and rank 0 alone can save them with the checkpoint.
- A refresh snapshots the banks at the first micro-batch of a due update; rank 0 runs K-Means on the snapshot, in
  the training thread (`swap_delay` 0) or on a background thread, and the new centroids are broadcast and installed
  `swap_delay` updates later (at the latest when the next refresh is due) on every rank at the same update. A job
  not finished by then is waited for, and the wait is logged: never a result that depends on timing.
- Before the first update every rank takes rank 0's centroids (no reliance on equal seeds); a job still running
  when the process exits (training over, --no-save included) is joined and its error logged.
"""

from __future__ import annotations

import atexit
import logging
import time
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from fairseq.logging import metrics
from torch import Tensor, nn

from fairseq_clusterformer.modules.cluster_layer import ClusterFormerLayer
from fairseq_clusterformer.modules.kmeans_job import LayerResult, RefreshJob
from fairseq_clusterformer.modules.memory_bank import MemoryBank
from fairseq_clusterformer.ops.kmeans import faiss_available

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


@dataclass
class PendingSwap:
    started_at: int  # update of the snapshot
    install_at: int
    job: RefreshJob | None  # None on ranks other than 0


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# every refresher of this process, for the exit hook below
_REFRESHERS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _finish_refreshers() -> None:
    """fairseq has no end-of-training hook for tasks, and with --no-save nothing saves (which would wait for a job):
    at interpreter exit, before logging shuts down, join every K-Means thread still running and report its error.
    Without this the daemon thread would be killed mid-work and a failure never reported."""
    for refresher in list(_REFRESHERS):
        refresher.finish()


class CentroidRefresher:
    def __init__(self, settings: RefreshSettings) -> None:
        _REFRESHERS.add(self)
        self.settings = settings
        self.layers: list[ClusterFormerLayer] = []
        self.banks: list[MemoryBank] = []
        self._staged: list[list[Tensor]] = []
        self.refreshes_started = 0
        self.num_refreshes = 0  # refreshes installed
        self.layer_refreshes: list[int] = []  # per layer: installs that replaced its centroids
        self.last_refresh_update = -1
        self.last_refresh_epoch = 1
        self.epoch_refresh_due = False
        self.pending: PendingSwap | None = None
        self.last_refresh_seconds = 0.0  # K-Means time of the last installed refresh (rank 0)
        self.last_stall_seconds = 0.0  # training time the last refresh cost (snapshot + wait + broadcast)
        self._start_seconds = 0.0
        self.restored = False
        self._checked_resume = False
        self._saved: dict | None = None  # state loaded before `attach`

    def attach(self, model: nn.Module) -> None:
        """Give every Cluster-Former layer of ``model`` a memory bank that its training forward fills."""
        self.layers = [m for m in model.modules() if isinstance(m, ClusterFormerLayer)]
        self.banks, self._staged = [], []
        for index, layer in enumerate(self.layers):
            if layer.num_clusters > self.settings.memory_size:
                raise ValueError(
                    f"--num-clusters ({layer.num_clusters}) is larger than --memory-size ({self.settings.memory_size}):"
                    " K-Means needs at least one state per cluster"
                )
            self.banks.append(
                MemoryBank(self.settings.memory_size, self.settings.sample_per_batch, self.settings.seed + index)
            )
            self._staged.append([])
            layer.state_sink = self._sink(index)
        self.layer_refreshes = [0] * len(self.layers)
        if self.layers and self.settings.backend == "faiss" and not faiss_available():
            raise ValueError(
                "--kmeans-backend faiss needs faiss: pip install faiss-cpu (or use --kmeans-backend torch)"
            )
        if self._saved is not None:
            self.load_state_dict(self._saved)

    def _sink(self, index: int):
        def collect(states: Tensor, padding_mask: Tensor | None) -> None:
            flat = states.reshape(-1, states.size(-1))  # (B*T) x C
            if padding_mask is not None:
                flat = flat[~padding_mask.reshape(-1)]  # pads never enter the bank
            self._staged[index].append(flat)

        return collect

    # ---- filling the banks -------------------------------------------------------------------------------------

    @torch.no_grad()
    def commit(self, discard: bool = False) -> None:
        """After every micro-batch, on every rank: append the staged states of every rank to every rank's banks.

        ``discard``: this rank's micro-batch was a dummy (fairseq's ``ignore_grad``); it contributes no states.
        """
        rank, size = world()
        for index, (layer, bank) in enumerate(zip(self.layers, self.banks)):
            staged, self._staged[index] = self._staged[index], []
            if size == 1:
                if staged and not discard:
                    self._warn_nonfinite(index, bank.add(torch.cat(staged)))
                continue
            rows = (
                torch.cat(staged) if staged and not discard else layer.centroids.new_zeros(0, layer.centroids.size(1))
            )
            self._exchange(index, bank, rows.to(layer.centroids.device, torch.float32), rank, size)

    def _exchange(self, index: int, bank: MemoryBank, rows: Tensor, rank: int, size: int) -> None:
        finite = torch.isfinite(rows).all(dim=1)  # N
        rows = rows[finite]
        counts = torch.tensor([rows.size(0), int((~finite).sum())], device=rows.device)
        every = [torch.zeros_like(counts) for _ in range(size)]
        dist.all_gather(every, counts)
        dropped = sum(int(c[1]) for c in every)
        bank.num_nonfinite_dropped += dropped
        self._warn_nonfinite(index, dropped)
        # every rank draws every rank's sample in rank order from the same generator: the banks stay identical
        picks = [bank.pick(int(c[0])) for c in every]
        kept = [int(c[0]) if pick is None else pick.numel() for c, pick in zip(every, picks)]
        if picks[rank] is not None:
            rows = rows[picks[rank].to(rows.device)]
        padded = rows.new_zeros(max(kept), rows.size(1))  # all_gather needs equal shapes
        padded[: rows.size(0)] = rows
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded)
        for part, count in zip(parts, kept):
            bank.append(part[:count])

    def _warn_nonfinite(self, index: int, dropped: int) -> None:
        if dropped:
            total = self.banks[index].num_nonfinite_dropped
            logger.warning(
                f"long-range layer {index}: {dropped} states with NaN/Inf kept out of the memory bank ({total} so far)"
            )

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
            for buffer in (layer.centroids, layer.shares):
                dist.broadcast(buffer, src=0)
            layer.update_groups()
        logger.info(f"initial centroids of {len(self.layers)} long-range layers broadcast from rank 0 to {size} ranks")

    def _start(self, update_num: int, start: float) -> None:
        self.last_refresh_update = update_num
        self.epoch_refresh_due = False
        seed = self.settings.seed + self.refreshes_started
        self.refreshes_started += 1
        job = None
        if world()[0] == 0:
            snapshots = [bank.contents() for bank in self.banks]  # copies: training goes on filling the banks
            clusters = [layer.num_clusters for layer in self.layers]
            s = self.settings
            job = RefreshJob(snapshots, clusters, s.iters, seed, s.backend)
        self.pending = PendingSwap(update_num, update_num + self.settings.swap_delay, job)
        if self.settings.swap_delay == 0:
            self._install(update_num, start)
            return
        if job is not None:
            job.start()
        self._start_seconds = time.perf_counter() - start
        logger.info(
            f"K-Means job {self.refreshes_started} started at update {update_num} on a snapshot of "
            f"{len(self.banks[0]) if self.banks else 0} states per layer; installs at update "
            f"{self.pending.install_at}"
        )

    @torch.no_grad()
    def _install(self, update_num: int, start: float) -> None:
        pending, self.pending = self.pending, None
        results = pending.job.wait() if pending.job is not None else None
        waited = time.perf_counter() - start
        _, size = world()
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
                dist.broadcast(ok, src=0)
                dist.broadcast(centroids, src=0)
                dist.broadcast(shares, src=0)
            if ok.item():
                layer.set_centroids(centroids, shares)
                self.layer_refreshes[index] += 1
            self._log_install(index, layer, result, update_num)
        if size > 1:
            self._check_ranks_agree(size)
        self.num_refreshes += 1
        self.last_refresh_seconds = sum(r.seconds for r in results) if results else 0.0
        self.last_stall_seconds = self._start_seconds + time.perf_counter() - start
        self._start_seconds = 0.0
        if self.settings.swap_delay > 0:
            logger.info(
                f"K-Means job {self.num_refreshes} (snapshot of update {pending.started_at}) installed at update "
                f"{update_num}: training waited {waited:.3f}s for it"
            )

    def finish(self) -> None:
        """When training has ended: join a background K-Means job that was never installed and report how it ended
        (its centroids are not installed: no update is left to install them at)."""
        pending, self.pending = self.pending, None
        if pending is None or pending.job is None or not pending.job.in_background:
            return
        name = f"K-Means job {self.refreshes_started} (snapshot of update {pending.started_at})"
        try:
            pending.job.wait()
        except RuntimeError as error:
            logger.error(f"{name} failed on its background thread: {error.__cause__!r}", exc_info=error)
            return
        logger.info(f"training ended before {name} was due for install at update {pending.install_at}: joined it")

    def _check_ranks_agree(self, size: int) -> None:
        """Guard against ranks drifting apart: compare a position-weighted checksum of every layer's centroids."""
        for index, layer in enumerate(self.layers):
            centroids = layer.centroids.detach().double()  # P x C
            weights = torch.arange(1, centroids.numel() + 1, device=centroids.device, dtype=torch.float64)
            checksum = (centroids.reshape(-1) * weights).sum().reshape(1)
            low, high = checksum.clone(), checksum.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if not torch.equal(low, high):
                raise RuntimeError(
                    f"long-range layer {index}: the {size} ranks hold different centroids after a refresh"
                )
        logger.info(f"K-Means job {self.num_refreshes + 1}: centroids identical on all {size} ranks")

    def _log_install(self, index: int, layer: ClusterFormerLayer, result: LayerResult | None, update: int) -> None:
        if result is None:
            return
        if result.centroids is None:
            logger.warning(f"long-range layer {index}: {result.skipped_because}; keeping the previous centroids")
        logger.info(
            f"K-Means refresh {self.num_refreshes + 1}, long-range layer {index}: {result.num_states} states, "
            f"{layer.num_clusters} clusters, {result.seconds:.2f}s ({result.backend}), installed at update "
            f"{update}"
        )

    # ---- checkpoints and logging -------------------------------------------------------------------------------

    def summary(self) -> dict:
        """The few facts inference wants to know about the centroids (small; kept in fairseq's task_state)."""
        return {"num_refreshes": self.num_refreshes, "layer_refreshes": list(self.layer_refreshes)}

    def state_dict(self) -> dict:
        """Everything an exact resume needs; waits for a job in flight and saves its result, not its input."""
        pending = None
        if self.pending is not None:
            results = self.pending.job.wait() if self.pending.job is not None else None
            pending = {
                "started_at": self.pending.started_at,
                "install_at": self.pending.install_at,
                "results": None if results is None else [r.state_dict() for r in results],
            }
        return {
            "banks": [bank.state_dict() for bank in self.banks],
            "refreshes_started": self.refreshes_started,
            "num_refreshes": self.num_refreshes,
            "layer_refreshes": list(self.layer_refreshes),
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
        if state["banks"] is None:
            # a best, epoch or update checkpoint: the banks travel in checkpoint_last.pt only
            logger.warning(
                "this checkpoint carries the K-Means schedule but no memory banks (only checkpoint_last.pt keeps "
                "them): the banks refill from now, and the resumed run is not exact"
            )
        elif len(state["banks"]) != len(self.banks):
            raise ValueError(
                f"the checkpoint has memory banks for {len(state['banks'])} long-range layers, the model has "
                f"{len(self.banks)}: resume with the same --long-range-layers"
            )
        for bank, bank_state in zip(self.banks, state["banks"] or []):
            bank.load_state_dict(bank_state)
        for name in (
            "refreshes_started",
            "num_refreshes",
            "last_refresh_update",
            "last_refresh_epoch",
            "epoch_refresh_due",
        ):
            setattr(self, name, state[name])
        self.layer_refreshes = list(state["layer_refreshes"])
        self.pending = None
        if state["pending"] is not None:
            saved = state["pending"]["results"]
            job = None
            if saved is not None and world()[0] == 0:
                job = RefreshJob.finished([LayerResult.from_state_dict(r) for r in saved])
            self.pending = PendingSwap(state["pending"]["started_at"], state["pending"]["install_at"], job)
        self.restored = True

    def log_stats(self) -> None:
        """Per training step: cluster-size entropy (bits) of the batch and bank fill per long-range layer, and the
        K-Means time and training stall of the last refresh. Logged every step so no logging interval is empty."""
        for index, (layer, bank) in enumerate(zip(self.layers, self.banks)):
            if layer.last_cluster_entropy is not None:
                metrics.log_scalar(f"cluster_entropy_{index}", layer.last_cluster_entropy, weight=1, round=3)
            metrics.log_scalar(f"bank_{index}", len(bank), weight=0, round=0)
            if bank.num_nonfinite_dropped:
                metrics.log_scalar(f"bank_nonfinite_{index}", bank.num_nonfinite_dropped, weight=0, round=0)
        if self.layers:
            metrics.log_scalar("kmeans_s", self.last_refresh_seconds, weight=0, round=3)
            metrics.log_scalar("kmeans_stall_s", self.last_stall_seconds, weight=0, round=3)
            metrics.log_scalar("kmeans_refreshes", self.num_refreshes, weight=0, round=0)
