"""FIFO memory bank of recent hidden states, the data K-Means refreshes the centroids from (paper Algorithm 1).

N = states in one batch, M = capacity, C = model dim.
"""

import torch
from torch import Tensor


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
        self._buffer: Tensor | None = None  # M x C
        self._pos = 0  # next row to write
        self._size = 0  # valid rows
        self.total_seen = 0
        self.num_nonfinite_dropped = 0
        if dim is not None:
            self._allocate(dim)

    @property
    def dim(self) -> int | None:
        """C, or None before the first `add` when no dim was given."""
        return self._buffer.size(1) if self._buffer is not None else None

    @property
    def device(self) -> torch.device | None:
        return self._device

    def __len__(self) -> int:
        return self._size

    def _allocate(self, dim: int) -> None:
        device = self._device or torch.device("cpu")
        needed = self.capacity * dim * 4  # float32 rows
        free = free_memory(device)
        if free is not None and needed > free:
            raise ValueError(f"{self._size_message(dim, needed)}, more than the {free:,} bytes free on {device}")
        try:
            self._buffer = torch.zeros(self.capacity, dim, dtype=torch.float32, device=device)
        except RuntimeError as error:  # torch.OutOfMemoryError is one; a CPU allocation failure is a plain one
            raise ValueError(f"{self._size_message(dim, needed)}, which {device} could not allocate") from error

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
        if self._buffer is None:
            self._allocate(states.size(1))
        if states.size(1) != self.dim:
            raise ValueError(f"memory bank holds states of dim {self.dim}, got dim {states.size(1)}")

    def drop_nonfinite(self, states: Tensor) -> Tensor:
        """(N, C) -> (n, C): the rows without NaN/Inf; the dropped ones are counted in `num_nonfinite_dropped`."""
        states, dropped = finite_rows(states)
        self.num_nonfinite_dropped += dropped
        return states

    def pick(self, count: int) -> Tensor | None:
        """Sorted indices of the rows to keep out of a batch of `count` finite rows (None = all of them).

        Advances the sampling generator exactly as `add` does, so that every rank of a distributed run can draw every
        rank's picks from its own copy of the generator (the copies stay equal) and send rank 0 only the rows it keeps.
        """
        if not 0 < self.sample_per_batch < count:
            return None
        return torch.randperm(count, generator=self._generator)[: self.sample_per_batch].sort().values

    @torch.no_grad()
    def add(self, states: Tensor) -> int:
        """Append states (N, C), any float dtype and device; returns how many rows were dropped as NaN/Inf.

        Non-finite rows are dropped (one diverged batch must not poison every centroid), then, if `sample_per_batch`
        is set, a random subset of that many rows is kept in their original order. When more rows than the capacity
        arrive at once, only the last `capacity` are kept, as a FIFO would.
        """
        self._prepare(states)
        before = self.num_nonfinite_dropped
        states = self.drop_nonfinite(states.detach())
        keep = self.pick(states.size(0))
        if keep is not None:
            states = states[keep.to(states.device)]
        self.append(states)
        return self.num_nonfinite_dropped - before

    @torch.no_grad()
    def append(self, states: Tensor) -> None:
        """Append (n, C) finite, already sampled rows as they are (FIFO: the oldest rows are overwritten)."""
        self._prepare(states)
        self.total_seen += states.size(0)
        states = states.detach()[-self.capacity :].to(self._buffer.device, torch.float32)  # n x C, n <= M
        num = states.size(0)
        rows = (self._pos + torch.arange(num, device=self._buffer.device)) % self.capacity  # n, wraps around
        self._buffer[rows] = states
        self._pos = (self._pos + num) % self.capacity
        self._size = min(self._size + num, self.capacity)

    def contents(self) -> Tensor:
        """(n, C) float32 copy of the valid rows, oldest first ((0, 0) before anything was added)."""
        if self._buffer is None:
            return torch.zeros(0, 0)
        if self._size < self.capacity:
            return self._buffer[: self._size].clone()
        # Full: the oldest row is the next one to be overwritten.
        return torch.cat([self._buffer[self._pos :], self._buffer[: self._pos]])

    def clear(self) -> None:
        """Forget all rows; lifetime counters and the sampling generator carry on."""
        self._pos = 0
        self._size = 0

    def state_dict(self) -> dict:
        """Everything needed to resume exactly: valid rows (CPU, in ring layout), write position, counters, RNG."""
        return {
            "capacity": self.capacity,
            "dim": self.dim,
            "buffer": self._buffer[: self._size].cpu() if self._buffer is not None else None,
            "pos": self._pos,
            "size": self._size,
            "total_seen": self.total_seen,
            "num_nonfinite_dropped": self.num_nonfinite_dropped,
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: dict, rows: bool = True) -> None:
        """Restore from `state_dict()`; raises ValueError if the capacity or the states' dim differ from this bank's.

        ``rows`` False: only the counters and the sampling generator (a distributed run's ranks other than 0, which
        draw every rank's sample but bank no rows); the bank is left empty.
        """
        if state["capacity"] != self.capacity:
            raise ValueError(
                f"memory bank checkpoint has capacity {state['capacity']}, this bank has {self.capacity}: "
                "resume with the same --memory-size"
            )
        if state["dim"] is not None and self.dim is not None and state["dim"] != self.dim:
            raise ValueError(f"memory bank checkpoint holds states of dim {state['dim']}, this bank dim {self.dim}")
        self._buffer, self._pos, self._size = None, 0, 0
        if rows and state["dim"] is not None:
            self._allocate(state["dim"])
            self._buffer[: state["size"]] = state["buffer"].to(self._buffer.device)
            self._pos = state["pos"]
            self._size = state["size"]
        self.total_seen = state["total_seen"]
        self.num_nonfinite_dropped = state["num_nonfinite_dropped"]
        self._generator.set_state(state["generator"])


def finite_rows(states: Tensor) -> tuple[Tensor, int]:
    """(N, C) -> the (n, C) rows without NaN/Inf, and how many were dropped (one diverged batch must not poison every
    centroid)."""
    finite = torch.isfinite(states).all(dim=1)  # N
    dropped = int((~finite).sum())
    return (states[finite] if dropped else states), dropped


def free_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on ``device`` (the CPU: Linux's MemAvailable), or None when unknown."""
    if device.type == "cuda":
        # what the driver has free, plus what torch's caching allocator holds reserved but unused
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
    except OSError:
        return None
    available = fields.get("MemAvailable", "").split()  # "21312345 kB"
    return int(available[0]) * 1024 if available else None
