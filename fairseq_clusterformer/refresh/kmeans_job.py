"""One centroid refresh as a job: K-Means on snapshots of the memory banks, run in the caller or on a thread.

N = banked states of one layer, P = clusters, C = model dim.

The job only ever reads the snapshots it was given, so training may go on filling the banks while it runs. Its
result depends on the snapshots and the seed alone: whether it ran inline or in the background, and however long it
took, every run (and every resumed run) installs the same centroids at the same update. A ``PendingSwap`` is a job
between its snapshot and its install: what a checkpoint saves of it, and what is left to join when training ends.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import torch
from torch import Tensor

from fairseq_clusterformer.ops.centroid_shift import adjusted_rand_index, nearest_cosine
from fairseq_clusterformer.ops.cluster_groups import cluster_shares
from fairseq_clusterformer.ops.clustering import nearest_ids
from fairseq_clusterformer.ops.kmeans import is_degenerate, order_centroids, resolve_backend, spherical_kmeans

logger = logging.getLogger(__name__)


@dataclass
class LayerResult:
    """What one refresh produced for one long-range layer."""

    centroids: Tensor | None  # P x C, unit-norm, greedily ordered; None = keep the current centroids
    num_states: int
    seconds: float
    skipped_because: str = ""
    backend: str = ""
    shares: Tensor | None = None  # P, each centroid's share of the banked states (the strict mode's group cuts)
    # how far the refresh moved the centroids it replaced (ops/centroid_shift.py); None where none were given
    nearest_cosine: float | None = None
    agreement: float | None = None

    def shift_note(self) -> str:
        """How far the refresh moved the centroids, for its log line ('' where it was not measured)."""
        if self.nearest_cosine is None or self.agreement is None:
            return ""
        return (
            f"; against the centroids it replaced: nearest cosine {self.nearest_cosine:.3f} (mean over the new ones), "
            f"the banked states' clusters agree at adjusted Rand {self.agreement:.3f}"
        )

    def state_dict(self) -> dict:
        centroids = None if self.centroids is None else self.centroids.cpu()
        return {
            "centroids": centroids,
            "num_states": self.num_states,
            "seconds": self.seconds,
            "skipped_because": self.skipped_because,
            "backend": self.backend,
            "shares": None if self.shares is None else self.shares.cpu(),
            "nearest_cosine": self.nearest_cosine,
            "agreement": self.agreement,
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> LayerResult:
        return cls(
            state["centroids"],
            state["num_states"],
            state["seconds"],
            state["skipped_because"],
            state["backend"],
            state.get("shares"),  # absent from checkpoints written before the strict mode's groups
            state.get("nearest_cosine"),  # these two: absent from checkpoints written before they were measured
            state.get("agreement"),
        )


def refresh_layer(
    states: Tensor, num_clusters: int, iters: int, seed: int, backend: str, previous: Tensor | None = None
) -> LayerResult:
    """Spherical K-Means of one layer's banked states (N x C), greedily ordered; skipped on a degenerate bank.
    With the centroids it replaces (``previous``, P x C), also how far it moved them, on the same states.

    Always in float32, also when called inside an autocast region (a synchronous refresh runs inside fairseq's
    ``--amp`` training step): half-precision similarities would move states between neighbouring centroids.
    """
    with torch.autocast(states.device.type, enabled=False):
        return _refresh_layer(states, num_clusters, iters, seed, backend, previous)


def _refresh_layer(
    states: Tensor, num_clusters: int, iters: int, seed: int, backend: str, previous: Tensor | None
) -> LayerResult:
    start = time.perf_counter()
    if states.size(0) < num_clusters:
        reason = f"{states.size(0)} banked states are fewer than the {num_clusters} clusters"
        return LayerResult(None, states.size(0), time.perf_counter() - start, reason)
    if is_degenerate(states, num_clusters):
        reason = f"the {states.size(0)} banked states hold fewer than {num_clusters} distinct directions"
        return LayerResult(None, states.size(0), time.perf_counter() - start, reason)
    backend = resolve_backend(backend, states.device)
    fresh = order_centroids(spherical_kmeans(states, num_clusters, iters, seed, backend))
    ids = nearest_ids(states, fresh)  # N: the banked states' clusters, for the shares and for the shift
    shares = cluster_shares(ids, num_clusters)
    result = LayerResult(fresh, states.size(0), time.perf_counter() - start, backend=backend, shares=shares)
    if previous is not None:  # after the clock: the shift is a measurement, not part of the refresh's cost
        result.nearest_cosine = nearest_cosine(previous, fresh)
        result.agreement = adjusted_rand_index(nearest_ids(states, previous), ids, previous.size(0), num_clusters)
    return result


class RefreshJob:
    """K-Means of every long-range layer's bank snapshot; `run()` in the caller or `start()` on a thread."""

    def __init__(
        self,
        snapshots: list[Tensor],
        clusters: list[int],
        iters: int,
        seed: int,
        backend: str,
        previous: list[Tensor] | None = None,
    ) -> None:
        self.snapshots = snapshots  # per layer: N x C float32, owned by the job
        self.previous = previous  # per layer: the P x C centroids the refresh replaces, or None
        self.clusters = clusters
        self.iters = iters
        self.seed = seed
        self.backend = backend
        self._results: list[LayerResult] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stream = None

    @classmethod
    def finished(cls, results: list[LayerResult]) -> RefreshJob:
        """A job whose results are already known (restored from a checkpoint)."""
        job = cls([], [], 0, 0, "")
        job._results = results
        return job

    def run(self) -> None:
        try:
            results = []
            previous = self.previous if self.previous is not None else [None] * len(self.snapshots)
            for states, clusters, old in zip(self.snapshots, self.clusters, previous):
                results.append(refresh_layer(states, clusters, self.iters, self.seed, self.backend, old))
            if self._stream is not None:
                self._stream.synchronize()
            self._results = results
        except BaseException as error:  # re-raised in the training thread by wait()
            self._error = error
        finally:
            self.snapshots, self.previous = [], None  # the banks' copies are no longer needed

    def start(self) -> None:
        """Run on a daemon thread; on a GPU on a side stream that first waits for the snapshots' copies."""
        device = self.snapshots[0].device if self.snapshots else torch.device("cpu")
        if device.type == "cuda":
            self._stream = torch.cuda.Stream(device)
            self._stream.wait_stream(torch.cuda.current_stream(device))
        self._thread = threading.Thread(target=self._run_on_stream, name="kmeans-refresh", daemon=True)
        self._thread.start()

    def _run_on_stream(self) -> None:
        if self._stream is None:
            self.run()
            return
        with torch.cuda.stream(self._stream):
            self.run()

    @property
    def in_background(self) -> bool:
        """Whether ``start()`` put the job on a thread (which someone must join)."""
        return self._thread is not None

    def done(self) -> bool:
        return self._results is not None or self._error is not None

    def wait(self) -> list[LayerResult]:
        """Block until the job has finished; its results, or the error it raised."""
        if self._thread is not None:
            self._thread.join()
        elif not self.done():
            self.run()
        if self._error is not None:
            raise RuntimeError("the background K-Means refresh failed") from self._error
        assert self._results is not None
        return self._results


@dataclass(eq=False)  # compared and hashed by identity: it is kept in a set while in flight
class PendingSwap:
    """A refresh between the snapshot of the banks and the install of its centroids."""

    number: int  # the refresh's number, counted from 1 over the run
    started_at: int  # update of the snapshot
    install_at: int
    job: RefreshJob | None  # None on ranks other than 0

    def start(self) -> None:
        """Run the job on a thread, until ``results`` or, when training ends first, the exit hook joins it."""
        if self.job is not None:
            self.job.start()
            _IN_FLIGHT.add(self)

    def results(self) -> list[LayerResult] | None:
        """Wait for the job: its results (None on ranks other than 0)."""
        _IN_FLIGHT.discard(self)
        return self.job.wait() if self.job is not None else None

    def state_dict(self) -> dict:
        """Waits for the job: a checkpoint keeps its result, not its input (the snapshots)."""
        results = self.job.wait() if self.job is not None else None
        return {
            "started_at": self.started_at,
            "install_at": self.install_at,
            "results": None if results is None else [r.state_dict() for r in results],
        }

    @classmethod
    def from_state_dict(cls, state: dict, number: int, on_rank0: bool) -> PendingSwap:
        saved = state["results"]
        job = None  # only rank 0 installs results; the others take them from its broadcast
        if saved is not None and on_rank0:
            job = RefreshJob.finished([LayerResult.from_state_dict(r) for r in saved])
        return cls(number, state["started_at"], state["install_at"], job)

    def join(self) -> tuple[str, BaseException | None]:
        """When training has ended: join the job that was never installed; (how it ended, the error it raised). Its
        centroids are not installed: no update is left to install them at."""
        _IN_FLIGHT.discard(self)
        name = f"K-Means job {self.number} (snapshot of update {self.started_at})"
        try:
            self.job.wait()
        except RuntimeError as error:
            return f"{name} failed on its background thread: {error.__cause__!r}", error
        return f"training ended before {name} was due for install at update {self.install_at}: joined it", None


# background jobs not installed yet; strong references: the task that started one may be gone by the exit hook
_IN_FLIGHT: set[PendingSwap] = set()


def log_is_open(log: logging.Logger) -> bool:
    """Whether every stream that ``log``'s records reach is still open. The exit hook below runs before logging's
    own (it was registered after logging's), but a host may close a stream before any exit hook: pytest closes the
    files that capture a session's output, and a handler bound to one then prints "--- Logging error --- ...
    I/O operation on closed file" for every record."""
    current: logging.Logger | None = log
    while current is not None:
        for handler in current.handlers:
            if getattr(getattr(handler, "stream", None), "closed", False):
                return False
        current = current.parent if current.propagate else None
    return True


def report_at_exit(outcomes: list[tuple[str, BaseException | None]]) -> None:
    """Log how the joined jobs ended; where the log is closed, tell the process's own stderr instead (open until
    the interpreter is gone): one line for the jobs that finished, and every failure with its traceback."""
    if log_is_open(logger):
        for message, error in outcomes:
            if error is None:
                logger.info(message)
            else:
                logger.error(message, exc_info=error)
        return
    stream = sys.__stderr__
    if stream is None or stream.closed:
        return  # nothing is left to say it on
    finished = sum(error is None for _, error in outcomes)
    if finished:
        print(
            f"{__name__}: training ended with {finished} K-Means job(s) not yet installed: joined them after the log "
            "was closed (their centroids are not installed)",
            file=stream,
        )
    for message, error in outcomes:
        if error is not None:
            print(f"{__name__}: {message}", file=stream)
            traceback.print_exception(error, file=stream)
    stream.flush()


@atexit.register
def _join_in_flight() -> None:
    """fairseq has no end-of-training hook for tasks, and with --no-save nothing saves (which would wait for a job):
    at interpreter exit join every K-Means thread still running and report how it ended. Without this the daemon
    thread would be killed mid-work and a failure never reported."""
    outcomes = [pending.join() for pending in list(_IN_FLIGHT)]
    if outcomes:
        report_at_exit(outcomes)
