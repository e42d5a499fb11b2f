"""FIFO memory bank of recent hidden states, the data K-Means refreshes the centroids from (paper Algorithm 1).

N = states in one batch, M = capacity, C = model dim.

No host syncs in a training step: ``add`` takes the batch with a mask of the rows to keep (pads out) and writes
it with fixed shapes, on the device. The write position, the fill and the counters are device tensors; each kept
row goes to ``(pos + its rank among the kept rows - 1) % M``, the others to a spare row M that nothing reads (only
the last M kept rows write when more arrive). Reading a count (``len``, ``total_seen``, ``num_nonfinite_dropped``,
``contents``, ``state_dict``) syncs: that belongs to a refresh, a checkpoint or logging. ``sample_per_batch`` > 0
draws its sample on the host generator from the number of finite rows, so that path reads that number (a sync per
batch): a draw on the device would pick other rows than the runs so far.
"""

import copy

import torch
from torch import Tensor

from fairseq_clusterformer.refresh.device_memory import free_memory


class MemoryBank:
    """Ring buffer of the most recent `capacity` states of one cluster layer.

    A plain class rather than an nn.Module: the bank is training state, not model state, so it must stay out of the
    model's parameters and `state_dict` (checkpoints stay small for `fairseq-eval-lm`); the task saves it separately
    through `state_dict()`.

    Rows are stored float32 and detached, on the device given here or, lazily, on the device of the first states
    added (so the bank follows the model onto its GPU without being told).
    """

    def __init__(
        self,
        capacity: int,
        sample_per_batch: int = 0,
        seed: int = 1,
        *,
        dim: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        """
        Args:
            capacity: M, rows kept.
            sample_per_batch: if > 0, `add` keeps a random subset of this many rows of each batch (more diverse
                contents for the same M than whole consecutive batches).
            seed: seeds the subsampling generator.
            dim: C; allocates the buffer now instead of on the first `add`.
            device: where the buffer lives; default: the device of the first states added.
        """
        if capacity < 1:
            raise ValueError(f"memory bank capacity must be >= 1, got {capacity}")
        if sample_per_batch < 0:
            raise ValueError(f"sample_per_batch must be >= 0, got {sample_per_batch}")
        self.capacity = capacity
        self.sample_per_batch = sample_per_batch
        self.seed = seed
        self._device = torch.device(device) if device is not None else None
        # CPU generator: the same subsample whatever device the states are on, and its state saves as a CPU tensor.
        self._generator = torch.Generator().manual_seed(seed)
        self._buffer: Tensor | None = None  # (M+1) x C: row M takes the writes of rows not kept
        # device-side counters (0-dim int64), so that a write never reads a count back to the host
        self._pos = torch.zeros((), dtype=torch.long)  # next row to write
        self._size = torch.zeros((), dtype=torch.long)  # valid rows
        self._seen = torch.zeros((), dtype=torch.long)
        self._dropped = torch.zeros((), dtype=torch.long)
        self._host: tuple[int, int] | None = (0, 0)  # (pos, size) while known on the host: no read-back needed
        self.last_destination: Tensor | None = None  # N: the rows the last add wrote (M = not kept), or None
        if dim is not None:
            self._allocate(dim)

    def __deepcopy__(self, memo: dict) -> "MemoryBank":
        """A deep copy (fairseq's model EMA deep-copies the model the banks hang on). torch.Generator deep-copies
        only from torch 2.1 on (torch 2.0: "cannot pickle 'torch._C.Generator' object"): its state is copied here."""
        copied = object.__new__(type(self))
        memo[id(self)] = copied
        for name, value in self.__dict__.items():
            if name == "_generator":
                value, state = torch.Generator(), value.get_state()
                value.set_state(state)
            else:
                value = copy.deepcopy(value, memo)
            setattr(copied, name, value)
        return copied

    @property
    def dim(self) -> int | None:
        """C, or None before the first `add` when no dim was given."""
        return self._buffer.size(1) if self._buffer is not None else None

    @property
    def device(self) -> torch.device | None:
        return self._device

    def __len__(self) -> int:
        """Valid rows (reads the device's count, a sync, unless nothing was written since the host last knew it)."""
        return self._pos_size()[1]

    def _pos_size(self) -> tuple[int, int]:
        if self._host is None:
            self._host = (int(self._pos), int(self._size))
        return self._host

    @property
    def fill(self) -> Tensor:
        """Valid rows as a 0-dim device tensor (for logging without a sync)."""
        return self._size.clone()

    @property
    def total_seen(self) -> int:
        """Rows ever written (after the NaN/Inf filter and the sample); reads the device's count."""
        return int(self._seen)

    @property
    def num_nonfinite_dropped(self) -> int:
        """Rows with NaN/Inf kept out so far; reads the device's count."""
        return int(self._dropped)

    @property
    def nonfinite_dropped(self) -> Tensor:
        """``num_nonfinite_dropped`` as a 0-dim device tensor (no sync)."""
        return self._dropped.clone()

    def count_nonfinite(self, dropped: Tensor | int) -> None:
        """Add NaN/Inf rows kept out elsewhere (a distributed run counts every rank's)."""
        self._dropped += dropped

    def _counters_to(self, device: torch.device) -> None:
        self._pos, self._size, self._seen, self._dropped = (
            t.to(device) for t in (self._pos, self._size, self._seen, self._dropped)
        )

    def _allocate(self, dim: int) -> None:
        device = self._device or torch.device("cpu")
        needed = self.capacity * dim * 4  # float32 rows
        free = free_memory(device)
        if free is not None and needed > free:
            raise ValueError(f"{self._size_message(dim, needed)}, more than the {free:,} bytes free on {device}")
        try:
            self._buffer = torch.zeros(self.capacity + 1, dim, dtype=torch.float32, device=device)
        except RuntimeError as error:  # torch.OutOfMemoryError is one; a CPU allocation failure is a plain one
            raise ValueError(f"{self._size_message(dim, needed)}, which {device} could not allocate") from error
        self._counters_to(device)

    def _size_message(self, dim: int, needed: int) -> str:
        """The start of the error for a bank that does not fit; the caller says where it does not."""
        return (
            f"lower --memory-size {self.capacity}: the memory bank of each long-range layer holds {self.capacity} "
            f"states x {dim} dims x 4 bytes = {needed:,} bytes ({needed / 2**30:,.1f} GiB)"
        )

    def _prepare(self, states: Tensor) -> None:
        """Check the shape and allocate the buffer on the first states' device."""
        if states.dim() != 2:
            raise ValueError(f"memory bank expects N x C states, got shape {tuple(states.shape)}")
        if self._device is None:
            self._device = states.device
            if self._buffer is not None:
                self._buffer = self._buffer.to(self._device)
            self._counters_to(self._device)
        if self._buffer is None:
            self._allocate(states.size(1))
        if states.size(1) != self.dim:
            raise ValueError(f"memory bank holds states of dim {self.dim}, got dim {states.size(1)}")

    def pick(self, count: int) -> Tensor | None:
        """Sorted indices of the rows to keep out of a batch of `count` finite rows (None = all of them).

        Advances the sampling generator exactly as `add` does, so that every rank of a distributed run can draw every
        rank's picks from its own copy of the generator (the copies stay equal) and send rank 0 only the rows it keeps.
        """
        if not 0 < self.sample_per_batch < count:
            return None
        return torch.randperm(count, generator=self._generator)[: self.sample_per_batch].sort().values

    @torch.no_grad()
    def add(self, states: Tensor, valid: Tensor | None = None) -> Tensor:
        """Append the rows of states (N, C; any float dtype and device) where ``valid`` (N bool, None = all) is True;
        returns how many of those were dropped as NaN/Inf (a 0-dim device tensor: no sync).

        Non-finite rows are dropped (one diverged batch must not poison every centroid), then, if `sample_per_batch`
        is set, a random subset of that many rows is kept in their original order. When more rows than the capacity
        arrive at once, only the last `capacity` are kept, as a FIFO would.
        """
        self._prepare(states)
        self.last_destination = None
        states = states.detach()
        finite = torch.isfinite(states).all(dim=1)  # N
        real = torch.ones_like(finite) if valid is None else valid.to(finite.device)  # N
        keep = finite & real  # N
        dropped = (real & ~finite).sum()  # NaN/Inf in a pad row is no news: pads are not states
        self._dropped += dropped
        if self.sample_per_batch > 0:
            # the sample is drawn on the host generator from the number of finite rows: a sync, on this path only
            states = states[keep]  # n x C, the finite rows
            pick = self.pick(states.size(0))
            self.append(states if pick is None else states[pick.to(states.device)])
        else:
            self._write(states, keep)
        return dropped

    @torch.no_grad()
    def append(self, states: Tensor) -> None:
        """Append (n, C) finite, already sampled rows as they are (FIFO: the oldest rows are overwritten)."""
        self._prepare(states)
        self.last_destination = None
        self._write(states.detach(), None)

    def _write(self, states: Tensor, keep: Tensor | None) -> None:
        """Write the rows of ``states`` (N x C) where ``keep`` (N, None = all) is True, in fixed shapes on the
        device: the k-th kept row goes to ``(pos + k - 1) % M`` if it is among the last M kept, else to spare row M."""
        if states.size(0) == 0:
            return
        device = self._buffer.device
        rows = states.to(device, torch.float32)  # N x C
        if keep is None:
            rank = torch.arange(1, rows.size(0) + 1, device=device)  # N: 1-based rank among the kept rows
            total = torch.full((), rows.size(0), dtype=torch.long, device=device)
            writes = rank > rows.size(0) - self.capacity  # N: the last M rows
        else:
            keep = keep.to(device)
            rank = torch.cumsum(keep, 0)  # N, int64
            total = rank[-1]  # kept rows
            writes = keep & (total - rank < self.capacity)  # N: the last M kept rows
        spare = torch.full_like(rank, self.capacity)  # N
        destination = torch.where(writes, (self._pos + rank - 1) % self.capacity, spare)  # N
        # duplicate indices only at the spare row, which is never read; index_put_ rather than index_copy_: under
        # torch.use_deterministic_algorithms it has a deterministic CUDA path, where index_copy_ throws
        self._buffer.index_put_((destination,), rows)
        self.last_destination = destination
        self._host = None  # the counts below change on the device
        self._pos.copy_((self._pos + total) % self.capacity)
        self._size.copy_(torch.clamp(self._size + total, max=self.capacity))
        self._seen += total

    def oldest_first(self) -> Tensor:
        """(n,) buffer rows of the valid states, oldest first (full: the oldest is the next one to be overwritten)."""
        pos, size = self._pos_size()
        device = self._buffer.device if self._buffer is not None else None
        start = pos if size == self.capacity else 0
        return (start + torch.arange(size, device=device)) % self.capacity  # n

    def contents(self) -> Tensor:
        """(n, C) float32 copy of the valid rows, oldest first ((0, 0) before anything was added)."""
        if self._buffer is None:
            return torch.zeros(0, 0)
        return self._buffer[self.oldest_first()]

    @torch.no_grad()
    def replace(self, rows: Tensor) -> None:
        """Hold exactly ``rows`` (n x C, n <= M, oldest first) and nothing else; the counters stay as they are (a
        distributed run's merge of the ranks' shards, ``LayerBanks.gather``)."""
        self._prepare(rows)
        if rows.size(0) > self.capacity:
            raise ValueError(f"{rows.size(0)} rows do not fit a memory bank of {self.capacity}")
        self._buffer[: rows.size(0)] = rows.to(self._buffer)
        self._pos.fill_(rows.size(0) % self.capacity)
        self._size.fill_(rows.size(0))
        self._host = (rows.size(0) % self.capacity, rows.size(0))

    def set_counts(self, total_seen: int, nonfinite_dropped: int) -> None:
        """Overwrite the lifetime counters (the totals over the ranks of a distributed run)."""
        self._seen.fill_(total_seen)
        self._dropped.fill_(nonfinite_dropped)

    def clear(self) -> None:
        """Forget all rows; lifetime counters and the sampling generator carry on."""
        self._pos.zero_()
        self._size.zero_()
        self._host = (0, 0)

    def state_dict(self) -> dict:
        """Everything needed to resume exactly: valid rows (CPU, in ring layout), write position, counters, RNG."""
        return {
            "capacity": self.capacity,
            "dim": self.dim,
            "buffer": self._buffer[: len(self)].cpu() if self._buffer is not None else None,
            "pos": self._pos_size()[0],
            "size": len(self),
            "total_seen": self.total_seen,
            "num_nonfinite_dropped": self.num_nonfinite_dropped,
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: dict, rows: bool = True, device: torch.device | str | None = None) -> None:
        """Restore from `state_dict()`; raises ValueError if the capacity or the states' dim differ from this bank's.

        ``rows`` False: only the counters and the sampling generator (a distributed run's ranks other than 0, which
        draw every rank's sample but bank no rows); the bank is left empty.
        ``device``: where the rows go (the layer's device: a checkpoint holds them on the CPU, and a refresh due
        before the first ``add`` after a resume must run on the device the uninterrupted run used); default: the
        bank's device so far, else the CPU until the first ``add`` moves them.
        """
        if device is not None:
            self._device = torch.device(device)
        if state["capacity"] != self.capacity:
            raise ValueError(
                f"memory bank checkpoint has capacity {state['capacity']}, this bank has {self.capacity}: "
                "resume with the same --memory-size"
            )
        if state["dim"] is not None and self.dim is not None and state["dim"] != self.dim:
            raise ValueError(f"memory bank checkpoint holds states of dim {state['dim']}, this bank dim {self.dim}")
        self._buffer = None
        counters = (0, 0, state["total_seen"], state["num_nonfinite_dropped"])
        if rows and state["dim"] is not None:
            self._allocate(state["dim"])
            self._buffer[: state["size"]] = state["buffer"].to(self._buffer.device)
            counters = (state["pos"], state["size"], state["total_seen"], state["num_nonfinite_dropped"])
        device = self._buffer.device if self._buffer is not None else (self._device or torch.device("cpu"))
        self._pos, self._size, self._seen, self._dropped = (
            torch.tensor(value, dtype=torch.long, device=device) for value in counters
        )
        self._host = (counters[0], counters[1])
        self._generator.set_state(state["generator"])
