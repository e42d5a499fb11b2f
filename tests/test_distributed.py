"""Two ranks over gloo on CPU: rank 0 alone holds the memory banks, equal to one process's, every rank the same
centroids; a run saved on two ranks resumes exactly on one, and a run saved by one process on two.

The banks are sharded (every rank keeps its own states, merged on rank 0 by ``LayerBanks.gather`` before a refresh
and before a save, as the task calls it): the merged bank must be the one process's."""

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings

CLUSTERS, DIM, UPDATES = 4, 8, 4
SAVED_AT = 2  # the checkpoint is taken before this update, as fairseq saves after the update before it


def rank_states(rank, update):
    gen = torch.Generator().manual_seed(100 * rank + update)
    states = torch.randn(2, 30, DIM, generator=gen) + 3 * rank  # the ranks see different data
    if rank == 1 and update == 2:
        states[0, 3, 0] = float("nan")  # a diverged state on one rank: dropped and counted on every rank
    return states


def make(delay, sample=40):
    layer = ClusterFormerLayer(LayerSettings(DIM, 16, 2, 4, 2), CLUSTERS).train()
    settings = RefreshSettings(
        memory_size=150, sample_per_batch=sample, interval=1, iters=10, backend="torch", seed=7, swap_delay=delay
    )
    refresher = CentroidRefresher(settings)
    refresher.attach(layer)
    return layer, refresher


def run(layer, refresher, parts_of_update, updates):
    """`parts_of_update(u)` gives the micro-batches this process runs in update u; returns the centroids after each."""
    history = []
    for update in updates:
        refresher.banks.gather()  # every update is due for a refresh here (a no-op in one process)
        refresher.before_step(update)
        for states, dummy in parts_of_update(update):
            layer(states)
            refresher.commit(discard=dummy)
        history.append(layer.centroids.clone())
    return torch.stack(history)


def rank_parts(rank):
    # in the last update rank 1 has run out of data and runs fairseq's dummy batch (ignore_grad): no states banked
    return lambda update: [(rank_states(rank, update), rank == 1 and update == UPDATES - 1)]


def one_process_parts(update):
    """Rank 0's and rank 1's micro-batches of an update, one after the other, as --update-freq 2 runs them."""
    parts = [(rank_states(0, update), False)]
    return parts if update == UPDATES - 1 else parts + [(rank_states(1, update), False)]


def checkpoint(layer, refresher):
    """What fairseq saves: the model (with the centroids) and the task's refresher state."""
    return {"model": layer.state_dict(), "refresher": refresher.state_dict()}


def resumed(delay, saved, sample=40):
    layer, refresher = make(delay, sample)
    layer.load_state_dict(saved["model"])
    refresher.load_state_dict(saved["refresher"])
    return layer, refresher


def bank_facts(refresher):
    refresher.banks.gather()  # as before a save: the shards merge on rank 0
    bank = refresher.banks[0]
    return {
        "rows": bank.contents(),
        "allocated": bank.dim is not None,
        "generator": bank.state_dict()["generator"],
        "dropped": bank.num_nonfinite_dropped,
    }


def worker(rank, folder, delay, sample):
    dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=2)
    torch.manual_seed(rank)  # different initial centroids per rank, on purpose
    layer, refresher = make(delay, sample)
    history = run(layer, refresher, rank_parts(rank), range(SAVED_AT))
    refresher.banks.gather()  # every rank, before the save (the task's pre-save hook)
    if rank == 0:  # fairseq saves on rank 0 only
        torch.save(checkpoint(layer, refresher), f"{folder}/two_ranks_checkpoint.pt")
    history = torch.cat([history, run(layer, refresher, rank_parts(rank), range(SAVED_AT, UPDATES))])
    # the same ranks resume from a checkpoint that one process wrote
    saved = torch.load(f"{folder}/one_process_checkpoint.pt", weights_only=False)
    again_layer, again = resumed(delay, saved, sample)
    again_history = run(again_layer, again, rank_parts(rank), range(SAVED_AT, UPDATES))
    result = {
        "history": history,
        "bank": bank_facts(refresher),
        "resumed": again_history,
        "resumed_bank": bank_facts(again),
    }
    torch.save(result, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("sample", [40, 0])
def test_rank_0_holds_one_process_banks_and_runs_resume_across_world_sizes(tmp_path, sample):
    for delay in (0, 1):
        folder = tmp_path / str(delay)
        folder.mkdir()
        torch.manual_seed(0)
        layer, refresher = make(delay, sample=sample)
        one = run(layer, refresher, one_process_parts, range(SAVED_AT))
        torch.save(checkpoint(layer, refresher), folder / "one_process_checkpoint.pt")
        one = torch.cat([one, run(layer, refresher, one_process_parts, range(SAVED_AT, UPDATES))])
        one_bank = refresher.banks[0].contents()

        mp.start_processes(worker, args=(str(folder), delay, sample), nprocs=2, start_method="spawn")
        rank0, rank1 = (torch.load(folder / f"rank{r}.pt", weights_only=False) for r in (0, 1))
        first = 1 + delay  # the first refresh starts at update 1 and installs `delay` updates later
        assert not torch.equal(rank0["history"][first], rank0["history"][0]), "a refresh replaced the centroids"
        for got in (rank0, rank1):
            assert torch.equal(got["history"][first:], one[first:])
            assert torch.equal(got["resumed"], one[SAVED_AT:])
            assert got["bank"]["dropped"] == 1  # the NaN state of rank 1, counted on both ranks
        for bank in (rank0["bank"], rank0["resumed_bank"]):
            assert torch.equal(bank["rows"], one_bank)
        for bank in (rank1["bank"], rank1["resumed_bank"]):
            # only rank 0 holds bank rows (rank 1 holds its shard between merges, emptied by the merge)
            assert bank["rows"].numel() == 0
        # rank 1 draws every rank's sample as rank 0 does: their sampling generators never part
        assert torch.equal(rank1["bank"]["generator"], rank0["bank"]["generator"])

        # one process resumes from the checkpoint rank 0 wrote for both ranks
        saved = torch.load(folder / "two_ranks_checkpoint.pt", weights_only=False)
        assert len(saved["refresher"]["banks"][0]["buffer"]) > 0
        layer, refresher = resumed(delay, saved, sample=sample)
        assert torch.equal(run(layer, refresher, one_process_parts, range(SAVED_AT, UPDATES)), one[SAVED_AT:])
        assert torch.equal(refresher.banks[0].contents(), one_bank)


EXITING_RANK = """
import atexit, sys
import torch.distributed as dist
# registered before the package: atexit runs it after the package's own handlers
atexit.register(lambda: print("process group alive at exit:", dist.is_initialized(), flush=True))
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
import fairseq_clusterformer  # noqa: F401
"""


def test_a_run_that_leaves_its_process_group_gets_it_destroyed_at_exit(tmp_path):
    """fairseq never destroys its process group; left alive, gloo's threads can abort the exiting process."""
    proc = subprocess.run(
        [sys.executable, "-c", EXITING_RANK, str(tmp_path / "init")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "process group alive at exit: False" in proc.stdout, proc.stdout + proc.stderr[-2000:]
