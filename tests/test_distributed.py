"""Two ranks over gloo on CPU: every refresh leaves identical centroids on every rank."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fairseq_clusterformer.modules.centroid_refresh import CentroidRefresher, RefreshSettings
from fairseq_clusterformer.modules.cluster_layer import ClusterFormerLayer
from fairseq_clusterformer.modules.windowed_layer import LayerSettings
from fairseq_clusterformer.ops.kmeans import order_centroids, spherical_kmeans

CLUSTERS, DIM = 4, 8


def rank_states(rank, refresh):
    gen = torch.Generator().manual_seed(100 * rank + refresh)
    return torch.randn(2, 30, DIM, generator=gen) + 3 * rank  # the ranks see different data


def worker(rank, init_file, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(rank)  # different initial centroids per rank, on purpose
    layer = ClusterFormerLayer(LayerSettings(DIM, 16, 2, 4, 2), CLUSTERS).train()
    refresher = CentroidRefresher(RefreshSettings(memory_size=200, interval=1, iters=10, backend="torch", seed=7))
    refresher.attach(layer)
    history = []
    for update in range(1, 4):
        layer(rank_states(rank, update))
        refresher.maybe_refresh(update)
        history.append(layer.centroids.clone())
    gathered = [torch.zeros_like(torch.stack(history)) for _ in range(2)]
    dist.all_gather(gathered, torch.stack(history))
    if rank == 0:
        results.put([g.tolist() for g in gathered])
    dist.destroy_process_group()


def test_two_ranks_install_identical_centroids_at_every_refresh(tmp_path):
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(worker, args=(str(tmp_path / "init"), results), nprocs=2, start_method="spawn")
    rank0, rank1 = (torch.tensor(h) for h in results.get())
    assert torch.equal(rank0, rank1)
    # and they are the K-Means of both ranks' banks together (each rank keeps memory_size / 2 = 100 states)
    banks = [torch.cat([rank_states(r, u).reshape(-1, DIM) for u in (1, 2, 3)])[-100:] for r in (0, 1)]
    expected = order_centroids(spherical_kmeans(torch.cat(banks), CLUSTERS, 10, seed=7 + 2, backend="torch"))
    assert torch.allclose(rank0[-1], expected, atol=1e-6)
    assert not torch.allclose(rank0[0], rank0[-1])
