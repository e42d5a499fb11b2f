"""Spherical K-Means on a memory bank of hidden states and the greedy centroid order (paper Algorithm 1).

Pure torch (+ numpy and faiss, both optional at import time); never imports fairseq.

N = states in the bank, P = number of clusters, C = model dim.
"""

import functools
import math
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

# Working memory one chunk of the torch backend may take (states + similarities), so that a 100k x 1024 bank with
# 512 clusters is processed ~10k rows at a time instead of materialising an N x P matrix.
_CHUNK_BYTES = 64 * 2**20
# Coordinates of unit states are compared at this many decimals when counting distinct states: closer states are
# the same point as far as K-Means is concerned.
_DEGENERATE_DECIMALS = 4
_BACKENDS = ("faiss", "torch")


@functools.lru_cache(maxsize=1)
def _faiss() -> ModuleType | None:
    """The faiss module, or None; imported lazily so that importing this file never pays for (or fails on) faiss."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def faiss_available() -> bool:
    """True when `import faiss` works (faiss-cpu or faiss-gpu)."""
    return _faiss() is not None


def greedy_order(centroids: Tensor) -> Tensor:
    """Greedy nearest-neighbour order of centroids (Algorithm 1, GetCentroids).

    Starts at centroid 0 and repeatedly moves to the unused centroid with the highest cosine similarity to the current
    one (ties go to the lowest index), so that neighbouring cluster ids hold similar states.

    Args:
        centroids: (P, C) any float dtype and device.
    Returns:
        (P,) LongTensor permutation on the centroids' device; `centroids[order]` is the ordered set.
    """
    assert centroids.dim() == 2, f"centroids must be P x C, got shape {tuple(centroids.shape)}"
    num = centroids.size(0)
    # On CPU in float64 so that every rank and device derives the same order from the same centroids: a near-tie
    # resolved differently by a GPU matmul would permute cluster ids between ranks.
    unit = F.normalize(centroids.detach().to("cpu", torch.float64), dim=-1)
    sim = unit @ unit.t()  # P x P
    used = torch.zeros(num, dtype=torch.bool)
    order = torch.zeros(num, dtype=torch.long)
    current = 0
    if num > 0:
        used[0] = True
    for step in range(1, num):
        current = int(sim[current].masked_fill(used, -math.inf).argmax())
        used[current] = True
        order[step] = current
    return order.to(centroids.device)


def order_centroids(centroids: Tensor) -> Tensor:
    """(P, C) centroids -> (P, C) unit-norm float32 centroids in greedy order, on the input's device."""
    unit = F.normalize(centroids.detach().float(), dim=-1)
    return unit[greedy_order(unit)]


def random_ordered_centroids(num_clusters: int, dim: int, generator: torch.Generator | None = None) -> Tensor:
    """Centroids used before the first K-Means: random Gaussian directions, unit-norm, greedily ordered.

    Returns (P, C) float32 on the generator's device (CPU without one).
    """
    device = generator.device if generator is not None else torch.device("cpu")
    return order_centroids(torch.randn(num_clusters, dim, generator=generator, device=device))


def is_degenerate(states: Tensor, num_clusters: int) -> bool:
    """True when `states` (N, C) hold fewer distinct directions than `num_clusters`, so K-Means should be skipped.

    Directions are unit-normalised and rounded to `_DEGENERATE_DECIMALS` decimals. Each rounded row is first hashed
    to one exactly computed integer (distinct hashes imply distinct rows), which settles the usual, healthy case
    with a `unique` over N numbers; only when the hashes say "too few" are the rows themselves compared.
    """
    if states.size(0) < num_clusters:
        return True
    assert states.size(1) < 2**19, "the float64 hash below is exact only for C < 2^19"
    gen = torch.Generator().manual_seed(0)
    # Integer weights < 2^20 times integer coordinates |q| <= 10^4 < 2^14, summed over C < 2^19 terms: every partial
    # sum stays below 2^53, so a float64 matvec (faster on CPU than an int64 multiply-sum) computes the hash exactly,
    # in any summation order.
    weights = torch.randint(1, 2**20, (states.size(1),), generator=gen).to(states.device, torch.float64)
    scale = 10.0**_DEGENERATE_DECIMALS
    hashes = torch.cat([_rounded(chunk, scale).double() @ weights for chunk in _chunks(states, 0)])  # N
    if torch.unique(hashes).numel() >= num_clusters:
        return False
    return torch.unique(_rounded(states, scale), dim=0).size(0) < num_clusters


def _rounded(states: Tensor, scale: float) -> Tensor:
    """(n, C) -> (n, C) float32 unit rows scaled by `scale` and rounded to integers."""
    return torch.round(F.normalize(states.detach().float(), dim=-1) * scale)


def _chunks(states: Tensor, num_clusters: int) -> list[Tensor]:
    """Row chunks of `states` sized so that a float32 chunk plus its chunk x P similarities fit `_CHUNK_BYTES`."""
    rows = max(1, _CHUNK_BYTES // (4 * (states.size(1) + num_clusters)))
    return list(states.split(rows))


def spherical_kmeans(
    states: Tensor,
    num_clusters: int,
    iters: int = 20,
    seed: int = 1,
    backend: str = "faiss",
    use_gpu: bool = False,
    init: Tensor | None = None,
) -> Tensor:
    """Spherical K-Means: cosine assignment of unit-normalised states, centroid = normalised mean of its members.

    The cosine assignment matches how the layer assigns clusters (`argmax_p cos(h, c_p)`). The centroids are NOT
    greedily ordered; pass them to `order_centroids`.

    Args:
        states: (N, C) any float dtype and device; computed in float32. N >= num_clusters.
        num_clusters: P.
        iters: Lloyd iterations (assignment + update).
        seed: seeds the initial choice of centroids (and faiss's sampling).
        backend: "faiss" (faiss.Kmeans, on all GPUs when `use_gpu` and faiss was built with GPUs, else CPU) or
            "torch" (chunked Lloyd iterations on the states' device; bit-identical across CPU runs).
        use_gpu: faiss backend only.
        init: (P, C) initial centroids (e.g. the current ones, to warm-start a refresh); default: P distinct states
            chosen at random with `seed`. Random initialisation can settle in a local optimum (two centroids sharing
            one true cluster while another centroid straddles two), which no number of iterations undoes.
    Returns:
        (P, C) unit-norm float32 centroids on the states' device.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"unknown K-Means backend {backend!r}, expected one of {_BACKENDS}")
    if states.dim() != 2:
        raise ValueError(f"states must be N x C, got shape {tuple(states.shape)}")
    if num_clusters < 1:
        raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
    if states.size(0) < num_clusters:
        raise ValueError(
            f"K-Means needs at least as many states as clusters: got {states.size(0)} states for {num_clusters} "
            "clusters (let the memory bank fill up first)"
        )
    if init is not None:
        if init.shape != (num_clusters, states.size(1)):
            raise ValueError(f"init must be {num_clusters} x {states.size(1)}, got shape {tuple(init.shape)}")
        init = F.normalize(init.detach().float(), dim=-1)
    if backend == "faiss":
        return _faiss_kmeans(states, num_clusters, iters, seed, use_gpu, init)
    return _torch_kmeans(states, num_clusters, iters, seed, init)


def _faiss_kmeans(
    states: Tensor, num_clusters: int, iters: int, seed: int, use_gpu: bool, init: Tensor | None
) -> Tensor:
    faiss = _faiss()
    if faiss is None:
        raise ValueError('backend="faiss" needs faiss: `pip install faiss-cpu` (or faiss-gpu), or use backend="torch"')
    num, dim = states.shape
    unit = F.normalize(states.detach().float(), dim=-1).cpu().numpy()  # N x C
    kmeans = faiss.Kmeans(
        dim,
        num_clusters,
        niter=iters,
        seed=seed,
        spherical=True,
        # faiss-cpu reports 0 GPUs for gpu=True and then runs on CPU, which is the fallback we want.
        gpu=use_gpu,
        verbose=False,
        # faiss silently trains on a random subset of max_points_per_centroid * P states (default 256 * P, i.e. only
        # 16k of a 100k bank for 64 clusters); the whole bank is the point of keeping one.
        max_points_per_centroid=math.ceil(num / num_clusters),
        # Below min_points_per_centroid * P states faiss only prints a warning; a small bank is legitimate here.
        min_points_per_centroid=1,
    )
    kmeans.train(unit, init_centroids=None if init is None else init.cpu().numpy())
    # faiss's spherical mode normalises after every update; normalising again only removes float rounding.
    return F.normalize(torch.from_numpy(kmeans.centroids).float(), dim=-1).to(states.device)


@torch.no_grad()
def _torch_kmeans(states: Tensor, num_clusters: int, iters: int, seed: int, init: Tensor | None) -> Tensor:
    if init is None:
        # CPU generator: the same seed picks the same initial points on every device.
        gen = torch.Generator().manual_seed(seed)
        picks = torch.randperm(states.size(0), generator=gen)[:num_clusters].to(states.device)
        centroids = F.normalize(states.detach()[picks].float(), dim=-1)  # P x C
    else:
        centroids = init.to(states.device)  # P x C
    chunks = _chunks(states.detach(), num_clusters)
    previous: Tensor | None = None
    for _ in range(iters):
        sums = torch.zeros_like(centroids)  # P x C
        counts = torch.zeros(num_clusters, dtype=torch.long, device=states.device)
        assignment = []
        for chunk in chunks:
            unit = F.normalize(chunk.float(), dim=-1)  # n x C
            ids = (unit @ centroids.t()).argmax(dim=1)  # n
            # index_add_ is sequential on CPU (bit-reproducible); on CUDA it uses atomics, so GPU runs agree only up
            # to float rounding.
            sums.index_add_(0, ids, unit)
            counts += torch.bincount(ids, minlength=num_clusters)
            assignment.append(ids)
        ids = torch.cat(assignment)  # N
        if previous is not None and torch.equal(ids, previous):
            # Same assignment as last iteration -> the update would reproduce the same centroids exactly.
            break
        previous = ids
        # An empty cluster keeps its previous centroid instead of becoming a zero vector.
        centroids = torch.where((counts > 0).unsqueeze(1), F.normalize(sums, dim=-1), centroids)
    return centroids
