"""What the ranks of a distributed run exchange about the memory banks and the centroids (gloo or NCCL).

n = states of one rank's micro-batch, P = clusters, C = model dim.

- Every rank banks its own states (its shard of each memory bank): no exchange in a training step but the
  ranks' counts of rows for the sample draw with ``--memory-sample-per-batch`` (``add_sampled_shard``). Rank 0 alone
  runs K-Means and saves checkpoints, so at a refresh or before a save the shards merge on rank 0: the ranks share
  their rows' stamps (``all_gather_varlen``), each sends rank 0 only its rows among the last ``--memory-size``
  (``gather_to_rank0``), and the counters are summed (``sum_over_ranks``).
- Rank 0's centroids reach every rank by broadcast (``broadcast_from_rank0``), and after every install a checksum
  compared across the ranks proves that they all hold the same ones (``check_ranks_agree``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.refresh.memory_bank import MemoryBank

logger = logging.getLogger(__name__)


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside a distributed run."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def add_sampled_shard(bank: MemoryBank, rows: Tensor, valid: Tensor | None) -> Tensor:
    """``--memory-sample-per-batch`` with sharded banks: write this rank's sample of its finite real rows (n x C,
    ``valid``: n or None) to its own shard; returns the NaN/Inf rows it dropped (0-dim tensor).

    Every rank draws every rank's picks, in rank order, from its copy of the bank's generator: the copies stay
    equal and the same rows are drawn as by one process. Drawing needs every rank's count of finite rows on the
    host: an all-gather and a sync per step, on this path only."""
    rank, size = world()
    if valid is not None:
        rows = rows[valid.to(rows.device)]
    rows, dropped = finite_rows(rows)
    count = torch.tensor([rows.size(0)], device=rows.device)
    every = [torch.zeros_like(count) for _ in range(size)]
    dist.all_gather(every, count)
    picks = [bank.pick(int(c)) for c in every]
    if picks[rank] is not None:
        rows = rows[picks[rank].to(rows.device)]
    bank.append(rows)
    bank.count_nonfinite(dropped)
    return torch.tensor(dropped, device=rows.device)


def finite_rows(states: Tensor) -> tuple[Tensor, int]:
    """(N, C) -> the (n, C) rows without NaN/Inf, and how many were dropped."""
    finite = torch.isfinite(states).all(dim=1)  # N
    dropped = int((~finite).sum())
    return (states[finite] if dropped else states), dropped


@torch.no_grad()
def gather_to_rank0(rows: Tensor, keys: Tensor) -> tuple[Tensor, Tensor] | None:
    """Every rank's rows (n_i x C) and their keys (n_i), concatenated in rank order, on rank 0; None elsewhere.

    Called by every rank together, at a refresh or a checkpoint, not in a training step: it reads the ranks' row
    counts back to the host to size the gather."""
    rank, size = world()
    count = torch.tensor([rows.size(0)], device=rows.device)
    every = [torch.zeros_like(count) for _ in range(size)]
    dist.all_gather(every, count)
    counts = [int(c) for c in every]
    width = max(counts)
    padded = rows.new_zeros(width, rows.size(1))  # width x C: gather needs equal shapes
    padded[: rows.size(0)] = rows
    padded_keys = keys.new_zeros(width)  # width
    padded_keys[: keys.size(0)] = keys
    parts = [torch.empty_like(padded) for _ in range(size)] if rank == 0 else None
    key_parts = [torch.empty_like(padded_keys) for _ in range(size)] if rank == 0 else None
    dist.gather(padded, parts, dst=0)
    dist.gather(padded_keys, key_parts, dst=0)
    if parts is None:
        return None
    return (
        torch.cat([part[:n] for part, n in zip(parts, counts)]),
        torch.cat([part[:n] for part, n in zip(key_parts, counts)]),
    )


@torch.no_grad()
def all_gather_varlen(values: Tensor) -> list[Tensor]:
    """Every rank's 1-D ``values`` (n_i), on every rank, in rank order (reads the lengths back: a sync)."""
    _, size = world()
    count = torch.tensor([values.numel()], device=values.device)
    every = [torch.zeros_like(count) for _ in range(size)]
    dist.all_gather(every, count)
    counts = [int(c) for c in every]
    padded = values.new_zeros(max(counts))  # max n_i: all_gather needs equal shapes
    padded[: values.numel()] = values
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded)
    return [part[:n] for part, n in zip(parts, counts)]


@torch.no_grad()
def sum_over_ranks(values: list[int], device: torch.device) -> list[int]:
    """Every rank's ``values`` added up, on every rank (a sync: for a refresh or a checkpoint)."""
    total = torch.tensor(values, dtype=torch.long, device=device)
    dist.all_reduce(total)
    return [int(v) for v in total]


@torch.no_grad()
def broadcast_from_rank0(tensors: Iterable[Tensor]) -> None:
    """Overwrite ``tensors`` on every rank with rank 0's, in place (called by every rank together)."""
    for tensor in tensors:
        dist.broadcast(tensor, src=0)


def checksum(centroids: Tensor) -> Tensor:
    """(1,) float64 position-weighted sum of the P x C centroids: a swap of two centroids changes it too."""
    flat = centroids.detach().double().reshape(-1)  # P*C
    weights = torch.arange(1, flat.numel() + 1, device=flat.device, dtype=torch.float64)
    return (flat * weights).sum().reshape(1)


@torch.no_grad()
def check_ranks_agree(layers: list[ClusterFormerLayer], refresh: int) -> None:
    """Guard against ranks drifting apart: raise unless every rank holds the same centroids in every layer."""
    _, size = world()
    for index, layer in enumerate(layers):
        low = checksum(layer.centroids)
        high = low.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if not torch.equal(low, high):
            raise RuntimeError(f"long-range layer {index}: the {size} ranks hold different centroids after a refresh")
    logger.info(f"K-Means job {refresh}: centroids identical on all {size} ranks")
