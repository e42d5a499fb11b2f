"""Two ranks over gloo on CPU: identical banks and centroids on every rank, equal to one process's."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fairseq_clusterformer.modules.centroid_refresh import CentroidRefresher, RefreshSettings
from fairseq_clusterformer.modules.cluster_layer import ClusterFormerLayer
from fairseq_clusterformer.modules.windowed_layer import LayerSettings

CLUSTERS, DIM, UPDATES = 4, 8, 4


def rank_states(rank, update):
    gen = torch.Generator().manual_seed(100 * rank + update)
    states = torch.randn(2, 30, DIM, generator=gen) + 3 * rank  # the ranks see different data
    if rank == 1 and update == 2:
        states[0, 3, 0] = float("nan")  # a diverged state on one rank: dropped and counted on every rank
    return states


def make(delay):
    layer = ClusterFormerLayer(LayerSettings(DIM, 16, 2, 4, 2), CLUSTERS).train()
    settings = RefreshSettings(
        memory_size=150, sample_per_batch=40, interval=1, iters=10, backend="torch", seed=7, swap_delay=delay
    )
    refresher = CentroidRefresher(settings)
    refresher.attach(layer)
    return layer, refresher


def run(layer, refresher, parts_of_update):
    """Updates 0..UPDATES-1; `parts_of_update(u)` gives the micro-batches this process runs in update u."""
    history = []
    for update in range(UPDATES):
        refresher.before_step(update)
        for states, dummy in parts_of_update(update):
            layer(states)
            refresher.commit(discard=dummy)
        history.append(layer.centroids.clone())
    return torch.stack(history), refresher.banks[0].contents(), refresher.banks[0].num_nonfinite_dropped


def worker(rank, init_file, delay, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(rank)  # different initial centroids per rank, on purpose
    layer, refresher = make(delay)
    # in the last update rank 1 has run out of data and runs fairseq's dummy batch (ignore_grad): no states banked
    history, bank, dropped = run(layer, refresher, lambda u: [(rank_states(rank, u), rank == 1 and u == UPDATES - 1)])
    results.put((rank, history.tolist(), bank.tolist(), dropped))
    dist.destroy_process_group()


def two_ranks(tmp_path, delay):
    tmp_path.mkdir()
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(worker, args=(str(tmp_path / "init"), delay, results), nprocs=2, start_method="spawn")
    return dict((r[0], r[1:]) for r in (results.get(), results.get()))


def one_process_parts(update):
    """Rank 0's and rank 1's micro-batches of an update, one after the other, as --update-freq 2 runs them."""
    parts = [(rank_states(0, update), False)]
    return parts if update == UPDATES - 1 else parts + [(rank_states(1, update), False)]


def test_two_ranks_hold_identical_banks_and_centroids_equal_to_one_process(tmp_path):
    for delay in (0, 1):
        ranks = two_ranks(tmp_path / str(delay), delay)
        (hist0, bank0, dropped0), (hist1, bank1, dropped1) = ranks[0], ranks[1]
        first = 1 + delay  # the first refresh starts at update 1 and installs `delay` updates later
        assert hist0[first:] == hist1[first:] and bank0 == bank1 and dropped0 == dropped1 == 1
        assert hist0[first] != hist0[0], "the refresh replaced rank 0's initial centroids"
        torch.manual_seed(0)
        layer, refresher = make(delay)
        history, bank, _ = run(layer, refresher, one_process_parts)
        assert torch.equal(torch.tensor(bank0), bank)
        assert torch.equal(torch.tensor(hist0)[first:], history[first:])
