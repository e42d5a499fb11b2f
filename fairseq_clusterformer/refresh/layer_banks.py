"""The memory banks of a model's Cluster-Former layers, one per layer, and how training fills them.

B = batch, T = tokens, C = model dim.

Each bank watches its layer through a forward pre-hook: in training, the layer's input states are staged with the
mask of the real tokens (the layer itself knows nothing of the bank); ``commit`` after the micro-batch moves them
into the bank.

One process never makes the host wait for the device in a step: pads stay out of the bank through the mask that
``MemoryBank.add`` writes with fixed shapes (not a boolean-mask index), and the NaN/Inf count that a warning reports
comes back to the host by a non-blocking copy, read once it has landed (``NonfiniteWatch``): on a GPU the warning
follows the step that dropped the states by a step or so.

A distributed run shards the banks: every rank writes its own states into its own bank (its shard,
``--memory-size`` rows, as above: no communication, no sync in a step), each row stamped with (micro-batch, rank).
``gather``, called by every rank together when a refresh snapshots the banks and before a checkpoint is saved,
merges the shards on rank 0: the rows in stamp order, the last ``--memory-size`` of them, so rank 0's bank then
holds exactly what one process running the ranks' micro-batches one after another would hold, and the counters
become the totals over the ranks on every rank. The other ranks' shards are emptied by the merge (their rows now
live on rank 0). Between merges each rank holds its own rows: ``snapshots`` and ``state_dict`` are only meaningful
right after a ``gather`` (they refuse otherwise). Every shard holds up to ``--memory-size`` rows: enough for any
split of the last rows among the ranks, so the merge is exact.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import torch
from torch import Tensor

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.refresh.memory_bank import MemoryBank
from fairseq_clusterformer.refresh.rank_exchange import (
    add_sampled_shard,
    all_gather_varlen,
    gather_to_rank0,
    sum_over_ranks,
    world,
)

logger = logging.getLogger(__name__)


def joined(staged: list[tuple[Tensor, Tensor | None]]) -> tuple[Tensor, Tensor | None]:
    """One micro-batch's staged (states N_i x C, mask N_i or None) as (N x C, N mask or None)."""
    rows = torch.cat([states for states, _ in staged])  # N x C
    if all(valid is None for _, valid in staged):
        return rows, None
    masks = [torch.ones_like(s[:, 0], dtype=torch.bool) if v is None else v for s, v in staged]
    return rows, torch.cat(masks)  # N


class NonfiniteWatch:
    """Counts (0-dim or small device tensors) that reach the host without making it wait: on a GPU each is copied
    into pinned memory without blocking, and ``landed`` returns those whose copy has finished; on the CPU there is
    nothing to wait for, so they land at once."""

    def __init__(self) -> None:
        self._pending: list[tuple[Tensor, torch.cuda.Event | None]] = []

    def push(self, counts: Tensor) -> None:
        if counts.is_cuda:
            host = torch.empty(counts.shape, dtype=counts.dtype, pin_memory=True)
            host.copy_(counts, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending.append((host, event))
        else:
            self._pending.append((counts, None))

    def landed(self) -> list[list[int]]:
        done = []
        while self._pending and (self._pending[0][1] is None or self._pending[0][1].query()):
            host, _ = self._pending.pop(0)
            done.append(host.tolist())  # a host tensor (or, on the CPU, the device itself): no wait
        return done


class LayerBanks(Sequence[MemoryBank]):
    """``banks[i]`` is long-range layer i's bank, filled with the layer's training inputs."""

    def __init__(self, layers: list[ClusterFormerLayer], capacity: int, sample_per_batch: int, seed: int) -> None:
        self.layers = layers
        self._commits = 0  # micro-batches committed since the start (or the resume): the stamp of their rows
        self._stamps: list[Tensor | None] = [None for _ in layers]  # per layer: (M+1) stamps of the shard's rows
        self._merged_counts = [(0, 0) for _ in layers]  # per layer: (total_seen, nonfinite) at the last merge
        self._gathered = True  # no commit since the last merge: rank 0's bank is the global one
        self._banks: list[MemoryBank] = []
        # per layer: this micro-batch's N x C states and their N mask of real tokens (None = all real)
        self._staged: list[list[tuple[Tensor, Tensor | None]]] = [[] for _ in layers]
        self._watches = [NonfiniteWatch() for _ in layers]
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        for index, layer in enumerate(layers):
            if layer.num_clusters > capacity:
                raise ValueError(
                    f"--num-clusters ({layer.num_clusters}) is larger than --memory-size ({capacity}): K-Means needs "
                    "at least one state per cluster"
                )
            self._banks.append(MemoryBank(capacity, sample_per_batch, seed + index))
            # the hook carries its layer's index, not a lookup by the layer's id: a deep copy of the model (fairseq's
            # EMA makes one) copies the hook with it, and the copied layer has another id
            hook = functools.partial(self._stage, index)
            self._hooks.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
            layer.banked = True

    def __getitem__(self, index):
        return self._banks[index]

    def __len__(self) -> int:
        return len(self._banks)

    def _stage(self, index: int, layer: ClusterFormerLayer, args: tuple, kwargs: dict) -> None:
        """The forward pre-hook of layer ``index``: a training pass's input states (B x T x C) and padding mask
        (B x T or None)."""
        if not layer.training:
            return
        states = args[0] if args else kwargs["x"]
        padding_mask = args[1] if len(args) > 1 else kwargs.get("padding_mask")
        flat = states.detach().reshape(-1, states.size(-1))  # (B*T) x C
        # pads never enter the bank; kept as a mask, since x[mask] would read the count back from the device
        valid = None if padding_mask is None else ~padding_mask.reshape(-1)  # B*T
        self._staged[index].append((flat, valid))

    def detach(self) -> None:
        """Stop watching the layers (the refresher attaches new banks to a model built again)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        for layer in self.layers:
            layer.banked = False

    @torch.no_grad()
    def commit(self, discard: bool = False) -> None:
        """After every micro-batch, on every rank: append this rank's staged states to its bank (in a distributed
        run its shard, stamped; ``gather`` merges the shards).

        ``discard``: this rank's micro-batch was a dummy (fairseq's ``ignore_grad``); it contributes no states.
        """
        rank, size = world()
        for index, (layer, bank) in enumerate(zip(self.layers, self._banks)):
            staged, self._staged[index] = self._staged[index], []
            rows, valid = joined(staged) if staged and not discard else (None, None)
            sampled = bank.sample_per_batch > 0
            if size > 1 and rows is None and sampled:  # the sample draw needs every rank's count
                rows = layer.centroids.new_zeros(0, layer.centroids.size(1))
            if rows is not None:
                rows = rows.to(layer.centroids.device, torch.float32)  # the bank's dtype: exact for half states
                # one process draws its sample inside add; ranks draw every rank's picks from their counts
                shared_draw = size > 1 and sampled
                dropped = add_sampled_shard(bank, rows, valid) if shared_draw else bank.add(rows, valid)
                if size > 1:
                    self._stamp(index, self._commits * size + rank)
                self._watches[index].push(torch.stack([dropped, bank.nonfinite_dropped.to(dropped.device)]))
            self._warn_nonfinite(index)
        self._commits += 1
        self._gathered = size == 1

    def _stamp(self, index: int, stamp: int) -> None:
        """Stamp the rows the last write put into layer ``index``'s shard (the spare row M takes the others')."""
        bank = self._banks[index]
        if bank.last_destination is None:
            return
        if self._stamps[index] is None:
            self._stamps[index] = torch.full((bank.capacity + 1,), -1, dtype=torch.long, device=bank.device)
        self._stamps[index].index_fill_(0, bank.last_destination, stamp)

    @torch.no_grad()
    def gather(self) -> None:
        """Distributed runs: merge every rank's shard into rank 0's bank (module docstring). Called by every
        rank together, when a refresh snapshots the banks and before a checkpoint is saved: it syncs."""
        rank, size = world()
        if size == 1:
            return
        for index, (layer, bank) in enumerate(zip(self.layers, self._banks)):
            device, dim = layer.centroids.device, layer.centroids.size(1)
            rows, stamps = torch.zeros(0, dim, device=device), torch.zeros(0, dtype=torch.long, device=device)
            if bank.dim is not None and len(bank):
                order = bank.oldest_first()  # n
                stamps = self._stamps[index]
                stamps = (stamps if stamps is not None else torch.full_like(order, -1, device=bank.device))[order]
                rows, stamps = bank.contents().to(device), stamps.to(device)
            # which rows survive is decided on the stamps alone (8 bytes a row), so that each rank sends rank 0 only
            # its rows among the last M: its newest ones, as a shard lists its rows oldest first
            every = all_gather_varlen(stamps)  # per rank: n_i stamps
            owners = torch.cat([torch.full_like(part, r) for r, part in enumerate(every)])  # sum n_i
            # a stable sort: rows of one stamp come from one rank's micro-batch, already in their order
            survivors = torch.sort(torch.cat(every), stable=True).indices[-bank.capacity :]  # <= M
            send = int((owners[survivors] == rank).sum())
            merged = gather_to_rank0(rows[rows.size(0) - send :], stamps[stamps.size(0) - send :])
            if merged is not None:
                rows, stamps = merged  # <= M rows, rank by rank
                keep = torch.sort(stamps, stable=True).indices  # oldest first
                bank.replace(rows[keep])
                self._stamps[index] = torch.full((bank.capacity + 1,), -1, dtype=torch.long, device=bank.device)
                self._stamps[index][: keep.numel()] = stamps[keep].to(bank.device)
            else:
                bank.clear()
            seen, dropped = self._merged_counts[index]
            delta = [bank.total_seen - seen, bank.num_nonfinite_dropped - dropped]
            seen_delta, dropped_delta = sum_over_ranks(delta, device)
            self._merged_counts[index] = (seen + seen_delta, dropped + dropped_delta)
            bank.set_counts(*self._merged_counts[index])
        self._gathered = True

    def _warn_nonfinite(self, index: int) -> None:
        for dropped, total in self._watches[index].landed():
            if dropped:
                logger.warning(
                    f"long-range layer {index}: {dropped} states with NaN/Inf kept out of the memory bank "
                    f"({total} so far)"
                )

    def snapshots(self) -> list[Tensor]:
        """Per layer an N x C copy of the bank (rank 0): K-Means reads it while training goes on filling the bank."""
        self._check_gathered("a snapshot")
        return [bank.contents() for bank in self._banks]

    def state_dict(self) -> list[dict]:
        self._check_gathered("saving")
        return [bank.state_dict() for bank in self._banks]

    def _check_gathered(self, before: str) -> None:
        if not self._gathered:
            raise RuntimeError(
                "the memory banks are sharded over the ranks and were not gathered since the last step: call "
                f"LayerBanks.gather() on every rank before {before}, or it would see rank 0's states only"
            )

    def load_state_dict(self, states: list[dict] | None) -> None:
        """Restore every bank; ``None``: the checkpoint has none (the banks stay as they are, with a warning).

        Only rank 0 takes the rows; the other ranks take the counters and the sampling generator. A checkpoint holds
        the global banks (the same rows whatever the world size that wrote it), so a run resumes on any number of
        ranks.
        """
        if states is None:
            # a best, epoch or update checkpoint: the banks travel in checkpoint_last.pt only
            logger.warning(
                "this checkpoint carries the K-Means schedule but no memory banks (only checkpoint_last.pt keeps "
                "them): the banks refill from now, and the resumed run is not exact"
            )
            return
        if len(states) != len(self._banks):
            raise ValueError(
                f"the checkpoint has memory banks for {len(states)} long-range layers, the model has "
                f"{len(self._banks)}: resume with the same --long-range-layers"
            )
        rank, _ = world()
        for layer, bank, state in zip(self.layers, self._banks, states):
            # the rows go where the layer is (its GPU once fairseq's trainer moved it there), not where the
            # checkpoint kept them (the CPU): otherwise a refresh due at once after the resume ran on the CPU
            bank.load_state_dict(state, rows=rank == 0, device=layer.centroids.device)
        # every rank takes the global counters; loaded rows are older than any new one (stamp -1)
        self._merged_counts = [(state["total_seen"], state["num_nonfinite_dropped"]) for state in states]
        self._stamps = [None for _ in self._banks]
        self._commits, self._gathered = 0, True
