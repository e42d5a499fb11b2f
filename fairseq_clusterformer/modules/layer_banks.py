"""The memory banks of a model's Cluster-Former layers, one per layer, and how training fills them.

B = batch, T = tokens, C = model dim.

A layer's training forward hands its input states to the bank's sink, which stages them; ``commit`` after the
micro-batch moves them into the bank. In a distributed run every rank's staged states go to rank 0's banks
(``rank_exchange.send_to_rank0``), and only rank 0 holds rows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import Tensor

from fairseq_clusterformer.modules.cluster_layer import ClusterFormerLayer, StateSink
from fairseq_clusterformer.modules.memory_bank import MemoryBank
from fairseq_clusterformer.modules.rank_exchange import send_to_rank0, world

logger = logging.getLogger(__name__)


class LayerBanks(Sequence[MemoryBank]):
    """``banks[i]`` is long-range layer i's bank; the layers' ``state_sink`` fill them in training."""

    def __init__(self, layers: list[ClusterFormerLayer], capacity: int, sample_per_batch: int, seed: int) -> None:
        self.layers = layers
        self._banks: list[MemoryBank] = []
        self._staged: list[list[Tensor]] = [[] for _ in layers]  # per layer: this micro-batch's N x C states
        for index, layer in enumerate(layers):
            if layer.num_clusters > capacity:
                raise ValueError(
                    f"--num-clusters ({layer.num_clusters}) is larger than --memory-size ({capacity}): K-Means needs "
                    "at least one state per cluster"
                )
            self._banks.append(MemoryBank(capacity, sample_per_batch, seed + index))
            layer.state_sink = self._sink(index)

    def __getitem__(self, index):
        return self._banks[index]

    def __len__(self) -> int:
        return len(self._banks)

    def _sink(self, index: int) -> StateSink:
        def collect(states: Tensor, padding_mask: Tensor | None) -> None:
            flat = states.reshape(-1, states.size(-1))  # (B*T) x C
            if padding_mask is not None:
                flat = flat[~padding_mask.reshape(-1)]  # pads never enter the bank
            self._staged[index].append(flat)

        return collect

    @torch.no_grad()
    def commit(self, discard: bool = False) -> None:
        """After every micro-batch, on every rank: append the staged states of every rank to rank 0's banks.

        ``discard``: this rank's micro-batch was a dummy (fairseq's ``ignore_grad``); it contributes no states.
        """
        _, size = world()
        for index, (layer, bank) in enumerate(zip(self.layers, self._banks)):
            staged, self._staged[index] = self._staged[index], []
            if size == 1:
                if staged and not discard:
                    self._warn_nonfinite(index, bank.add(torch.cat(staged)))
                continue
            centroids = layer.centroids
            rows = torch.cat(staged) if staged and not discard else centroids.new_zeros(0, centroids.size(1))
            self._warn_nonfinite(index, send_to_rank0(bank, rows.to(centroids.device, torch.float32)))

    def _warn_nonfinite(self, index: int, dropped: int) -> None:
        if dropped:
            total = self._banks[index].num_nonfinite_dropped
            logger.warning(
                f"long-range layer {index}: {dropped} states with NaN/Inf kept out of the memory bank ({total} so far)"
            )

    def snapshots(self) -> list[Tensor]:
        """Per layer an N x C copy of the bank (rank 0): K-Means reads it while training goes on filling the bank."""
        return [bank.contents() for bank in self._banks]

    def state_dict(self) -> list[dict]:
        return [bank.state_dict() for bank in self._banks]

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
        for bank, state in zip(self._banks, states):
            bank.load_state_dict(state, rows=rank == 0)
