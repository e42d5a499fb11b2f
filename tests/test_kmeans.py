import pytest
import torch
import torch.nn.functional as F

from fairseq_clusterformer.ops import kmeans
from fairseq_clusterformer.ops.kmeans import (
    faiss_available,
    greedy_order,
    is_degenerate,
    order_centroids,
    random_ordered_centroids,
    spherical_kmeans,
)

BACKENDS = ["torch", pytest.param("faiss", marks=pytest.mark.skipif(not faiss_available(), reason="faiss missing"))]


def planted(num_clusters: int = 8, per_cluster: int = 400, dim: int = 32, noise: float = 0.1, seed: int = 0):
    """Noisy unit vectors around `num_clusters` random directions: (N, C) states and (N,) planted labels."""
    gen = torch.Generator().manual_seed(seed)
    directions = F.normalize(torch.randn(num_clusters, dim, generator=gen), dim=-1)
    labels = torch.arange(num_clusters).repeat_interleave(per_cluster)
    states = F.normalize(directions[labels] + noise * torch.randn(len(labels), dim, generator=gen), dim=-1)
    return states, labels


def test_greedy_order_takes_nearest_unused_centroid_each_step():
    centroids = torch.randn(40, 16, generator=torch.Generator().manual_seed(3)) * 5
    order = greedy_order(centroids)
    assert order.dtype == torch.long
    assert sorted(order.tolist()) == list(range(40))
    assert order[0] == 0
    unit = F.normalize(centroids.double(), dim=-1)
    for step in range(1, 40):
        unused = sorted(set(range(40)) - set(order[:step].tolist()))
        cos = unit[unused] @ unit[order[step - 1]]
        assert unused[int(cos.argmax())] == order[step]


def test_greedy_order_of_tiny_sets():
    assert greedy_order(torch.randn(1, 4)).tolist() == [0]
    assert greedy_order(torch.randn(2, 4)).tolist() == [0, 1]


def test_order_centroids_is_unit_float32_in_greedy_order():
    centroids = torch.randn(20, 8, dtype=torch.float64) * 3
    ordered = order_centroids(centroids)
    assert ordered.dtype == torch.float32
    torch.testing.assert_close(ordered.norm(dim=-1), torch.ones(20))
    torch.testing.assert_close(ordered, F.normalize(centroids.float(), dim=-1)[greedy_order(centroids)])


def test_random_ordered_centroids_are_seeded_unit_and_already_ordered():
    first = random_ordered_centroids(32, 16, torch.Generator().manual_seed(5))
    second = random_ordered_centroids(32, 16, torch.Generator().manual_seed(5))
    assert first.shape == (32, 16) and first.dtype == torch.float32
    assert torch.equal(first, second)
    torch.testing.assert_close(first.norm(dim=-1), torch.ones(32))
    assert greedy_order(first).tolist() == list(range(32))


def recovered_purity(states, labels, centroids):
    """Share of points whose planted cluster maps to their recovered one, or 0 if the mapping is not one-to-one."""
    num = int(labels.max()) + 1
    ids = (states @ centroids.t()).argmax(dim=1)
    confusion = torch.zeros(num, centroids.size(0), dtype=torch.long)
    confusion.index_put_((labels, ids), torch.ones_like(ids), accumulate=True)
    if len(set(confusion.argmax(dim=1).tolist())) < num:
        return 0.0
    return confusion.max(dim=1).values.sum().item() / len(labels)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kmeans_recovers_planted_clusters(backend, device):
    states, labels = planted()
    on = device if backend == "torch" else torch.device("cpu")  # faiss reads CPU arrays; --device moves torch's
    # One member of each planted cluster as the start: from a random start Lloyd iterations often settle in a local
    # optimum (two centroids in one cluster), see spherical_kmeans's docstring.
    init = states[torch.arange(8) * 400 + 7]
    centroids = spherical_kmeans(states.to(on), 8, backend=backend, init=init.to(on)).cpu()
    assert centroids.shape == (8, 32) and centroids.dtype == torch.float32
    torch.testing.assert_close(centroids.norm(dim=-1), torch.ones(8))
    assert recovered_purity(states, labels, centroids) >= 0.99


@pytest.mark.parametrize("backend", BACKENDS)
def test_kmeans_from_random_start_ends_at_a_lloyd_fixed_point(backend):
    states, _ = planted(seed=1)
    centroids = spherical_kmeans(states.double(), 8, iters=100, seed=4, backend=backend)
    ids = (states @ centroids.t()).argmax(dim=1)
    means = F.normalize(torch.zeros(8, 32).index_add_(0, ids, states), dim=-1)
    torch.testing.assert_close(centroids, means, atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kmeans_ignores_state_norms(backend):
    # Cosine assignment, as the layer assigns clusters: rescaling states must not move any centroid.
    states = torch.randn(1000, 16, generator=torch.Generator().manual_seed(6))
    scales = torch.rand(1000, 1, generator=torch.Generator().manual_seed(7)) * 100 + 0.01
    torch.testing.assert_close(
        spherical_kmeans(states * scales, 10, backend=backend), spherical_kmeans(states, 10, backend=backend)
    )


def test_torch_backend_is_deterministic_for_a_seed(device):
    states = torch.randn(2000, 16, generator=torch.Generator().manual_seed(0)).to(device)
    first = spherical_kmeans(states, 10, seed=7, backend="torch")
    assert torch.equal(first, spherical_kmeans(states, 10, seed=7, backend="torch"))
    assert not torch.equal(first, spherical_kmeans(states, 10, seed=8, backend="torch"))


def test_faiss_backend_is_deterministic_for_a_seed():
    pytest.importorskip("faiss")
    states = torch.randn(2000, 16, generator=torch.Generator().manual_seed(0))
    first = spherical_kmeans(states, 10, seed=7, backend="faiss")
    torch.testing.assert_close(first, spherical_kmeans(states, 10, seed=7, backend="faiss"))


def test_torch_backend_does_not_depend_on_chunk_size(monkeypatch):
    states = torch.randn(3000, 24, generator=torch.Generator().manual_seed(2))
    whole = spherical_kmeans(states, 12, backend="torch")
    monkeypatch.setattr(kmeans, "_CHUNK_BYTES", 4 * (24 + 12) * 100)  # 100-row chunks
    torch.testing.assert_close(spherical_kmeans(states, 12, backend="torch"), whole, atol=1e-6, rtol=0)


def test_empty_cluster_keeps_its_centroid(device):
    # 3 distinct directions for 5 clusters: duplicate starting points leave clusters empty after the first assignment.
    directions = F.normalize(torch.randn(3, 8, generator=torch.Generator().manual_seed(1)), dim=-1)
    states = directions.repeat(20, 1).to(device)
    centroids = spherical_kmeans(states, 5, backend="torch").cpu()
    torch.testing.assert_close(centroids.norm(dim=-1), torch.ones(5))
    assert ((centroids @ directions.t()).max(dim=1).values > 1 - 1e-5).all()


def test_kmeans_accepts_half_precision_and_returns_float32():
    states, _ = planted(per_cluster=50)
    centroids = spherical_kmeans(states.bfloat16(), 8, backend="torch")
    assert centroids.dtype == torch.float32 and centroids.device == states.device


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_kmeans_rejects_fewer_states_than_clusters(backend):
    with pytest.raises(ValueError, match="at least as many states as clusters"):
        spherical_kmeans(torch.randn(5, 4), 8, backend=backend)


def test_kmeans_rejects_unknown_backend_and_bad_init():
    with pytest.raises(ValueError, match="unknown K-Means backend"):
        spherical_kmeans(torch.randn(50, 4), 8, backend="sklearn")
    with pytest.raises(ValueError, match="init must be 8 x 4"):
        spherical_kmeans(torch.randn(50, 4), 8, backend="torch", init=torch.randn(7, 4))


def test_missing_faiss_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(kmeans, "_faiss", lambda: None)
    assert not faiss_available()
    with pytest.raises(ValueError, match="pip install faiss-cpu"):
        spherical_kmeans(torch.randn(50, 4), 8, backend="faiss")


def test_is_degenerate():
    assert is_degenerate(torch.ones(1000, 16), 8)
    # Scaled copies share one direction.
    # (a fixed direction: one whose unit coordinates lie within float rounding of a 4th-decimal boundary would round
    # differently in some copies, the known limit of comparing rounded directions)
    direction = torch.randn(1, 16, generator=torch.Generator().manual_seed(0))
    assert is_degenerate(direction * torch.arange(1.0, 1001.0).unsqueeze(1), 2)
    assert not is_degenerate(torch.randn(1000, 16), 8)
    assert is_degenerate(torch.randn(5, 16), 8)
    # Exactly at the boundary: 8 distinct directions, repeated.
    distinct = torch.randn(8, 16).repeat(50, 1)
    assert not is_degenerate(distinct, 8)
    assert is_degenerate(distinct, 9)


def plain_lloyd(states, num_clusters, iters, seed):
    """Textbook spherical Lloyd iterations, every point against every centroid, for comparison."""
    unit = F.normalize(states, dim=-1)
    centroids = unit[torch.randperm(len(unit), generator=torch.Generator().manual_seed(seed))[:num_clusters]]
    for _ in range(iters):
        ids = (unit @ centroids.t()).argmax(dim=1)
        sums = torch.zeros_like(centroids).index_add_(0, ids, unit)
        counts = torch.bincount(ids, minlength=num_clusters)
        centroids = torch.where((counts > 0).unsqueeze(1), F.normalize(sums, dim=-1), centroids)
    return centroids


@pytest.mark.parametrize("noise", [0.05, 0.6])
def test_torch_backend_skipping_settled_points_equals_plain_lloyd(noise, monkeypatch, device):
    states, _ = planted(num_clusters=12, per_cluster=150, noise=noise, seed=3)
    visited = []
    assign = kmeans._assign
    monkeypatch.setattr(
        kmeans, "_assign", lambda unit, c, stale, *a: visited.append(stale.numel()) or assign(unit, c, stale, *a)
    )
    fast = spherical_kmeans(states.to(device), 12, iters=15, seed=2, backend="torch").cpu()
    torch.testing.assert_close(fast, plain_lloyd(states, 12, 15, seed=2), atol=1e-5, rtol=0)
    if noise < 0.1 and len(visited) > 2:
        assert visited[-1] < visited[0] / 2, f"points recomputed per iteration: {visited}"


def test_auto_backend_is_torch_on_a_gpu_and_faiss_on_a_cpu_when_installed(monkeypatch):
    assert kmeans.resolve_backend("auto", torch.device("cuda")) == "torch"
    assert kmeans.resolve_backend("auto", torch.device("cpu")) == ("faiss" if faiss_available() else "torch")
    monkeypatch.setattr(kmeans, "_faiss", lambda: None)
    assert kmeans.resolve_backend("auto", torch.device("cpu")) == "torch"
    assert kmeans.resolve_backend("faiss", torch.device("cuda")) == "faiss"
