"""Where the K-Means refresh runs and whether it repeats itself: the faiss backend on the states' own GPU (never on
every visible GPU), the CPU fallback said out loud, and cluster sums that add in a fixed order on a GPU."""

import logging
from types import SimpleNamespace

import pytest
import torch

from fairseq_clusterformer.ops import faiss_kmeans
from fairseq_clusterformer.ops.faiss_kmeans import faiss_placement, faiss_spherical_kmeans
from fairseq_clusterformer.ops.kmeans import cluster_sums


def gpu_faiss(num_gpus: int) -> SimpleNamespace:
    """Stands in for a faiss-gpu module: placement reads only these two names."""
    return SimpleNamespace(StandardGpuResources=object, get_num_gpus=lambda: num_gpus)


def test_faiss_runs_on_the_states_own_gpu_not_on_all_of_them():
    # faiss.Kmeans(gpu=True) would take every visible GPU, gpu=1 the first: rank 3's refresh must use cuda:3
    assert faiss_placement(gpu_faiss(8), torch.device("cuda:3")) == (3, "")
    assert faiss_placement(gpu_faiss(8), torch.device("cpu")) == (None, "")


def test_faiss_without_gpu_support_falls_back_to_the_cpu_with_a_reason():
    gpu, why = faiss_placement(SimpleNamespace(get_num_gpus=lambda: 0), torch.device("cuda:0"))
    assert gpu is None and "faiss-cpu" in why
    gpu, why = faiss_placement(gpu_faiss(0), torch.device("cuda:0"))
    assert gpu is None and "no GPU" in why


def test_the_cpu_fallback_for_gpu_states_is_logged(monkeypatch, caplog):
    faiss = pytest.importorskip("faiss")
    # CUDA states cannot exist here: make placement report what faiss-cpu reports for them
    monkeypatch.setattr(faiss_kmeans, "faiss_placement", lambda faiss, device: (None, "built without GPU support"))
    with caplog.at_level(logging.WARNING, logger=faiss_kmeans.__name__):
        faiss_spherical_kmeans(faiss, torch.randn(200, 8), 4, 5, 1, None)
    assert "built without GPU support" in caplog.text and "--kmeans-backend torch" in caplog.text


@pytest.mark.parametrize("init", [False, True])
def test_faiss_backend_computes_what_faiss_kmeans_computes(init):
    faiss = pytest.importorskip("faiss")
    states = torch.nn.functional.normalize(torch.randn(600, 16, generator=torch.Generator().manual_seed(0)), dim=-1)
    start = states[:7].clone() if init else None
    ours = faiss_spherical_kmeans(faiss, states, 7, 10, 3, start)
    theirs = faiss.Kmeans(
        16, 7, niter=10, seed=3, spherical=True, max_points_per_centroid=86, min_points_per_centroid=1
    )
    # the backend normalises its input (one more rounding of these unit rows): faiss.Kmeans gets the same array
    theirs.train(
        torch.nn.functional.normalize(states, dim=-1).numpy(), init_centroids=None if start is None else start.numpy()
    )
    expected = torch.nn.functional.normalize(torch.from_numpy(theirs.centroids), dim=-1)
    assert torch.equal(ours, expected)


def test_fixed_order_cluster_sums_equal_index_add():
    gen = torch.Generator().manual_seed(1)
    unit = torch.randn(40_000, 24, generator=gen)
    ids = torch.randint(0, 37, (40_000,), generator=gen)
    ids[ids == 5] = 6  # an empty cluster sums to zero in both
    atomic = cluster_sums(unit, ids, 37, fixed_order=False)
    ordered = cluster_sums(unit, ids, 37, fixed_order=True)
    torch.testing.assert_close(ordered, atomic, rtol=1e-5, atol=1e-4)
    assert torch.equal(ordered[5], torch.zeros(24))
    assert torch.equal(ordered, cluster_sums(unit, ids, 37, fixed_order=True))


def test_a_refresh_inside_autocast_computes_in_float32():
    # fairseq's --amp wraps the training step, and with it a synchronous refresh, in autocast
    from fairseq_clusterformer.refresh.kmeans_job import refresh_layer

    states = torch.randn(3000, 32, generator=torch.Generator().manual_seed(2))
    plain = refresh_layer(states, 16, 10, seed=1, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = refresh_layer(states, 16, 10, seed=1, backend="torch")
    assert mixed.centroids.dtype == torch.float32
    assert torch.equal(mixed.centroids, plain.centroids) and torch.equal(mixed.shares, plain.shares)
