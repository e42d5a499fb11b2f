"""No host syncs in a training step, a generation step or a QA forward.

On a GPU every scalar read (``int(t)``, ``.item()``), boolean-mask index (``aten.nonzero``), data-dependent shape
(``bincount``, ``masked_select``) and device-to-host copy makes the CPU wait until the GPU's queue drains. A
``TorchDispatchMode`` sees every op the code runs, so it catches them on the CPU too: scalar reads and
data-dependent shapes are the same ops on either device, and device-to-host copies are caught where the tensors are
on CUDA (on the CPU there are none). The K-Means job and the install of its centroids may sync (once per refresh):
the tests run them outside the guard.

B = batch, T = tokens, C = channels.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings

aten = torch.ops.aten
PACKAGE = Path(__file__).resolve().parents[1] / "fairseq_clusterformer"

# ops that make the host wait for the device: a scalar read, or an output whose shape depends on the data
SYNCING = {
    aten._local_scalar_dense,
    aten.item,
    aten.nonzero,
    aten.masked_select,
    aten.bincount,  # its length is max(input) + 1: read back from the device
    aten.unique_dim,
    aten._unique2,
    aten.equal,  # returns a host bool
    aten.is_nonzero,
}


class HostSyncGuard(TorchDispatchMode):
    """Records every syncing op with the innermost line of this package that ran it."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        syncs = func.overloadpacket in SYNCING or mask_index(func, args) or self._device_to_host(func, args, kwargs)
        if syncs and not host_side_by_design():
            self.found.append(f"{func} at {where()}")
        return func(*args, **kwargs)

    @staticmethod
    def _device_to_host(func, args, kwargs) -> bool:
        """A copy from a CUDA tensor to the CPU (``.cpu()``, ``.to("cpu")``, ``copy_``) that blocks the host."""
        if kwargs.get("non_blocking"):
            return False  # lands in pinned memory later: the host does not wait
        if func.overloadpacket is aten._to_copy:
            source, target = args[0], kwargs.get("device")
            return source.is_cuda and target is not None and torch.device(target).type == "cpu"
        if func.overloadpacket is aten.copy_:
            target, source = args[0], args[1]
            return source.is_cuda and not target.is_cuda and not (len(args) > 2 and args[2])
        return False


def mask_index(func, args) -> bool:
    """``x[mask]`` and ``x[mask] = y``: the CPU kernel finds the True positions inside the op (a CUDA one calls
    ``nonzero`` and reads its length back), so the op itself is the sync."""
    if func.overloadpacket not in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


# fairseq code that reads tensors which live on the host whatever the device (no GPU wait): the sinusoidal positions
# compare ``torch.onnx.operators.shape_as_tensor(input)``, a CPU tensor of the input's shape
HOST_SIDE = {("sinusoidal_positional_embedding.py", "forward")}


def caller_frames() -> list[traceback.FrameSummary]:
    """The stack without torch's frames and this guard's own."""
    guard = {"where", "__torch_dispatch__", "host_side_by_design", "caller_frames"}
    return [f for f in traceback.extract_stack() if "/torch/" not in f.filename and f.name not in guard]


def host_side_by_design() -> bool:
    frame = caller_frames()[-1]
    return (Path(frame.filename).name, frame.name) in HOST_SIDE


def where() -> str:
    """The innermost frame of this package on the stack (file:line function), or the innermost caller's."""
    frames = caller_frames()
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(PACKAGE)]
    frame = (ours or frames)[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"


def assert_no_syncs(guard: HostSyncGuard) -> None:
    assert not guard.found, "host syncs:\n" + "\n".join(sorted(set(guard.found)))


def test_the_guard_catches_the_syncs_it_is_meant_to_catch():
    """The guard must be able to fail: each of these stalls a GPU."""
    x = torch.randn(6, 3)
    for sync in (
        lambda: int(x.sum()),
        lambda: x[x[:, 0] > 0],
        lambda: torch.bincount(x[:, 0].long().abs()),
        lambda: x.sum().item(),
    ):
        with HostSyncGuard() as guard:
            sync()
        assert guard.found, "the guard missed a sync"
    with HostSyncGuard() as guard:
        torch.cumsum(x, 0).masked_fill(x > 0, 0.0).sort(dim=0)
    assert not guard.found


# ---- the language model: a training step and a generation step -----------------------------------------------


def lm_batch(task, length: int = 40):
    """B x T tokens with pads at the end of row 1 (pads must stay out of the bank without a boolean-mask index)."""
    d = task.target_dictionary
    tokens = torch.randint(4, len(d), (2, length), generator=torch.Generator().manual_seed(5))
    tokens[1, length - 9 :] = d.pad()
    target = torch.cat([tokens[:, 1:], tokens.new_full((2, 1), d.pad())], dim=1)  # B x T
    return tokens, target


def lm_step(task, model, tokens, target, update: int) -> None:
    task.refresher.before_step(update)
    logits = model(tokens)[0]  # B x T x V
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=task.target_dictionary.pad()
    )
    loss.backward()
    task.refresher.commit()
    task.refresher.log_stats()  # what the task's train_step logs every step: bank fill and NaN counts


def test_an_lm_training_step_does_not_sync(lm_data, device):
    from tests.test_model import build

    torch.manual_seed(0)
    flags = ["--num-clusters", 4, "--memory-size", 60, "--cluster-update-interval", 2, "--kmeans-swap-delay", 0]
    task, model = build(lm_data, *flags)
    model.to(device).train()
    tokens, target = (t.to(device) for t in lm_batch(task))
    with HostSyncGuard() as guard:
        lm_step(task, model, tokens, target, 1)  # an update without a refresh
    lm_step(task, model, tokens, target, 2)  # the refresh: K-Means and the install may sync
    assert task.refresher.num_refreshes == 1
    with HostSyncGuard() as guard_after:
        lm_step(task, model, tokens, target, 3)  # fitted centroids and shares, a full bank
    assert_no_syncs(guard)
    assert_no_syncs(guard_after)
    assert len(task.refresher.banks[0]) == 60  # the bank did fill: the steps were real


def test_an_lm_training_step_and_refresh_run_under_deterministic_algorithms(lm_data, device):
    """``torch.use_deterministic_algorithms(True)`` throws at any op without a deterministic kernel (on a GPU: a
    weighted ``bincount``, ``index_copy_``, ...); a user who asks for reproducibility must be able to train. On the
    CPU this runs the same code; `make gpu-check` runs it on CUDA (with CUBLAS_WORKSPACE_CONFIG set)."""
    from tests.test_model import build

    torch.manual_seed(0)
    flags = ["--num-clusters", 4, "--memory-size", 60, "--cluster-update-interval", 2, "--kmeans-swap-delay", 0]
    task, model = build(lm_data, *flags)
    model.to(device).train()
    tokens, target = (t.to(device) for t in lm_batch(task))
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for update in (1, 2, 3):  # update 2 refreshes and installs
            lm_step(task, model, tokens, target, update)
    finally:
        torch.use_deterministic_algorithms(was)
    assert task.refresher.num_refreshes == 1


def test_an_lm_generation_step_with_the_cache_does_not_sync(lm_data, device):
    from tests.test_model import build

    torch.manual_seed(0)
    flags = ["--num-clusters", 8, "--cluster-groups", 2, "--window-size", 8, "--window-stride", 4]
    task, model = build(lm_data, *flags)
    model.to(device).eval()
    tokens = lm_batch(task, 12)[0].to(device)
    state: dict = {}
    with torch.no_grad():
        model.decoder(tokens[:, :6], incremental_state=state)  # the prompt
        with HostSyncGuard() as guard:
            for t in range(6, tokens.size(1)):  # one token per call, as fairseq's generator does
                model.decoder(tokens[:, : t + 1], incremental_state=state)
    assert_no_syncs(guard)


# ---- QA: a forward, the criterion and the bank commit ------------------------------------------------------


def test_a_qa_training_step_does_not_sync(tmp_path_factory, device):
    from fairseq.utils import apply_to_sample

    from fairseq_clusterformer.qa.criterion import ClusterFormerQACriterion
    from tests.data.qa_model.synthetic import shared_data
    from tests.test_qa_model import batch, build

    task, model = build(shared_data(tmp_path_factory, nq=True))  # with the answer-type and paragraph heads
    model.to(device).train()
    criterion = ClusterFormerQACriterion(task)
    sample = apply_to_sample(lambda t: t.to(device), batch(task, "valid", [0, 1, 2]))
    with HostSyncGuard() as guard:
        loss, _, _ = criterion(model, sample)
        loss.backward()
        task.refresher.commit()
    assert_no_syncs(guard)
    assert len(task.refresher.banks[0]) > 0


# ---- two gloo ranks ---------------------------------------------------------------------------------------------

DIM = 8


def rank_worker(rank: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=2)
    try:
        rank_steps(rank, folder)
        # no rank tears its connections down while the other may still be sending its last collective's bytes
        dist.barrier()
    finally:
        # before the interpreter ends: gloo's worker threads must not outlive it (an unjoined thread at exit
        # aborts the process: "terminate called without an active exception")
        dist.destroy_process_group()


def rank_steps(rank: int, folder: str) -> None:
    torch.manual_seed(rank)
    layer = ClusterFormerLayer(LayerSettings(DIM, 16, 2, 4, 2), 4).train()
    refresher = CentroidRefresher(RefreshSettings(memory_size=50, interval=3, iters=5, backend="torch", seed=7))
    refresher.attach(layer)
    found = []
    for update in range(5):
        states = torch.randn(2, 20, DIM, generator=torch.Generator().manual_seed(10 * rank + update))
        pads = torch.zeros(2, 20, dtype=torch.bool)
        pads[1, 20 - 3 * (rank + 1) :] = True  # the ranks hold different numbers of real tokens
        if update in (0, 3):  # the broadcast of the initial centroids, a refresh: they may sync
            refresher.banks.gather()
            refresher.before_step(update)
        with HostSyncGuard() as guard:
            if update not in (0, 3):
                refresher.before_step(update)
            layer(states.requires_grad_(), pads).sum().backward()
            refresher.commit()
        found += guard.found
    refresher.banks.gather()  # as before a save
    facts = {"found": found, "refreshes": refresher.num_refreshes, "bank": len(refresher.banks[0])}
    torch.save(facts, f"{folder}/rank{rank}.pt")


def test_a_training_step_on_two_gloo_ranks_does_not_sync(tmp_path):
    """Sharded banks: a step neither communicates nor syncs (``tests/test_distributed.py`` proves the merged bank
    equals one process's)."""
    mp.start_processes(rank_worker, args=(str(tmp_path),), nprocs=2, start_method="spawn")
    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert result["refreshes"] == 1
        assert result["bank"] == (50 if rank == 0 else 0)  # merged on rank 0: 5 x (37 + 34) rows, the last 50
        assert not result["found"], f"rank {rank} host syncs:\n" + "\n".join(sorted(set(result["found"])))


@pytest.mark.parametrize("flag", ["scalar", "mask"])
def test_the_guard_reports_where_the_sync_is(flag):
    x = torch.randn(4, 2)
    with HostSyncGuard() as guard:
        if flag == "scalar":
            float(x.max())
        else:
            x[x > 0]
    assert len(guard.found) == 1 and "test_host_syncs.py" in guard.found[0]


def test_cluster_counts_equal_bincount_of_the_real_tokens():
    from fairseq_clusterformer.ops.clustering import cluster_counts

    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 5, (3, 17), generator=gen)  # P = 5 clusters
    pads = torch.rand(3, 17, generator=gen) < 0.3
    expected = torch.bincount(ids[~pads & (ids < 5)], minlength=5)
    assert torch.equal(cluster_counts(ids.masked_fill(pads, 5), 5, pads), expected)
    assert torch.equal(cluster_counts(ids, 5), torch.bincount(ids.reshape(-1), minlength=6)[:5])
