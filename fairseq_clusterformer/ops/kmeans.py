"""Spherical K-Means on a memory bank of hidden states and the greedy centroid order (paper Algorithm 1).

Pure torch (+ numpy and faiss, both optional at import time); never imports fairseq.

N = states in the bank, P = number of clusters, C = model dim.
"""

import functools
import math
import os
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_clusterformer.ops.faiss_kmeans import faiss_spherical_kmeans

# Working memory one chunk of the torch backend may take (states + similarities), so that a 100k x 1024 bank with
# 512 clusters is processed ~10k rows at a time instead of materialising an N x P matrix.
_CHUNK_BYTES = 64 * 2**20
# Coordinates of unit states are compared at this many decimals when counting distinct states: closer states are
# the same point as far as K-Means is concerned.
_DEGENERATE_DECIMALS = 4
# the names --kmeans-backend accepts (its choices are this tuple)
KMEANS_BACKENDS = ("auto", "torch", "faiss")
# Float32 similarities of unit vectors are exact to ~1e-6; the pruning bounds give up this much on every update so
# that rounding can never keep a point in a cluster that plain Lloyd iterations would move it out of.
_BOUND_SLACK = 1e-5


def _openblas_coretype() -> str | None:
    """The OpenBLAS kernel family this CPU supports, from /proc/cpuinfo's flags (None when unknown)."""
    try:
        with open("/proc/cpuinfo") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return None
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= set(flags):
        return "SkylakeX"
    if {"avx2", "fma"} <= set(flags):
        return "Haswell"
    return None


@functools.lru_cache(maxsize=1)
def _faiss() -> ModuleType | None:
    """The faiss module, or None; imported lazily so that importing this file never pays for (or fails on) faiss.

    faiss-cpu's wheels bundle OpenBLAS 0.3.15, whose CPU detection does not know recent Xeons (e.g. Sapphire and
    Emerald Rapids) and falls back to its generic SSE3 "Prescott" kernels: K-Means then runs ~3x slower (measured:
    100k x 512 into 512 clusters took 156 s instead of 55 s under the same load). Unless the user chose a core type,
    name the one the CPU's flags support before OpenBLAS loads (it reads OPENBLAS_CORETYPE once, at load time).
    faiss's loader messages about missing AVX2/AVX512 modules are harmless: 1.15 ships one dynamically dispatching
    library (`faiss.get_compile_options()` lists "DD AVX2 AVX512").
    """
    coretype = _openblas_coretype()
    if coretype is not None:
        os.environ.setdefault("OPENBLAS_CORETYPE", coretype)
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def faiss_available() -> bool:
    """True when `import faiss` works (faiss-cpu or faiss-gpu)."""
    return _faiss() is not None


def resolve_backend(backend: str, device: torch.device) -> str:
    """ "auto" -> the fastest correct backend for states on `device`: torch on a GPU (no copy to the host, and
    faster than faiss-cpu by far), faiss on a CPU when installed (its BLAS-blocked Lloyd iterations measured ~1.4x
    faster than the torch backend here), else torch. Other names are returned unchanged."""
    if backend != "auto":
        return backend
    if device.type == "cuda" or not faiss_available():
        return "torch"
    return "faiss"


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


def _chunk_rows(dim: int, num_clusters: int) -> int:
    """Rows per chunk so that a float32 chunk plus its chunk x P similarities fit `_CHUNK_BYTES`."""
    return max(1, _CHUNK_BYTES // (4 * (dim + num_clusters)))


def _chunks(states: Tensor, num_clusters: int) -> list[Tensor]:
    return list(states.split(_chunk_rows(states.size(1), num_clusters)))


def spherical_kmeans(
    states: Tensor,
    num_clusters: int,
    iters: int = 20,
    seed: int = 1,
    backend: str = "faiss",
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
        backend: "faiss" (faiss's Lloyd iterations, on the states' own GPU when they are on one and faiss was
            built with GPUs, else on the CPU: `ops.faiss_kmeans`), "torch" (chunked Lloyd iterations on the states'
            device; bit-identical across CPU runs, and run to run on a GPU) or "auto" (`resolve_backend`).
        init: (P, C) initial centroids (e.g. the current ones, to warm-start a refresh); default: P distinct states
            chosen at random with `seed`. Random initialisation can settle in a local optimum (two centroids sharing
            one true cluster while another centroid straddles two), which no number of iterations undoes.
    Returns:
        (P, C) unit-norm float32 centroids on the states' device.
    """
    if backend not in KMEANS_BACKENDS:
        raise ValueError(f"unknown K-Means backend {backend!r}, expected one of {KMEANS_BACKENDS}")
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
    if resolve_backend(backend, states.device) == "faiss":
        return _faiss_kmeans(states, num_clusters, iters, seed, init)
    return _torch_kmeans(states, num_clusters, iters, seed, init)


def _faiss_kmeans(states: Tensor, num_clusters: int, iters: int, seed: int, init: Tensor | None) -> Tensor:
    faiss = _faiss()
    if faiss is None:
        raise ValueError('backend="faiss" needs faiss: `pip install faiss-cpu` (or faiss-gpu), or use backend="torch"')
    return faiss_spherical_kmeans(faiss, states, num_clusters, iters, seed, init)


@torch.no_grad()
def _torch_kmeans(states: Tensor, num_clusters: int, iters: int, seed: int, init: Tensor | None) -> Tensor:
    """Lloyd iterations that skip the points whose assignment provably cannot have changed (Hamerly's bounds).

    For unit x and centroids moving c -> c', |x.c' - x.c| <= |c' - c|, so a point's similarity to its own centroid
    drops by at most that centroid's move, and its similarity to any other rises by at most the largest move. A
    point whose lower bound for its own centroid still beats the upper bound for every other keeps its cluster, and
    only the remaining points are multiplied with the centroids again. The assignment, and so every centroid, is the
    one plain Lloyd iterations give (up to float rounding at exact ties, which `_BOUND_SLACK` sends to recomputation).
    """
    unit = F.normalize(states.detach().float(), dim=-1)  # N x C, normalised once
    num = unit.size(0)
    if init is None:
        # CPU generator: the same seed picks the same initial points on every device.
        gen = torch.Generator().manual_seed(seed)
        picks = torch.randperm(num, generator=gen)[:num_clusters].to(unit.device)
        centroids = unit[picks]  # P x C
    else:
        centroids = init.to(unit.device)  # P x C
    rows = _chunk_rows(unit.size(1), num_clusters)
    ids = torch.full((num,), -1, dtype=torch.long, device=unit.device)  # -1: not assigned yet
    own = torch.zeros(num, device=unit.device)  # lower bound of cos(x, own centroid)
    rival = torch.zeros(num, device=unit.device)  # upper bound of cos(x, any other centroid)
    stale = torch.arange(num, device=unit.device)  # points whose cluster may change: all, at first
    for _ in range(iters):
        changed = _assign(unit, centroids, stale, rows, ids, own, rival)
        if not changed:
            # no point moved: the update would reproduce the same centroids exactly
            break
        sums = cluster_sums(unit, ids, num_clusters, fixed_order=unit.is_cuda)  # P x C
        counts = torch.bincount(ids, minlength=num_clusters)  # P; integer adds: exact in any order
        # An empty cluster keeps its previous centroid instead of becoming a zero vector.
        moved = torch.where((counts > 0).unsqueeze(1), F.normalize(sums, dim=-1), centroids)  # P x C
        shift = (moved - centroids).norm(dim=-1)  # P
        centroids = moved
        own -= shift[ids] + _BOUND_SLACK
        rival += shift.max() + _BOUND_SLACK
        stale = (own <= rival).nonzero().squeeze(1)  # points that might change cluster
    return centroids


def cluster_sums(unit: Tensor, ids: Tensor, num_clusters: int, fixed_order: bool) -> Tensor:
    """Sum of the N x C rows of every cluster: P x C.

    ``fixed_order`` False: ``index_add_`` (deterministic on the CPU; on a GPU its float atomics add 100k rows in
    whatever order the threads arrive, so two runs differ in the last bits and, through the next assignments, in
    their centroids). True: one-hot (rows x P) x rows (rows x C) matrix products over fixed chunks, which add in the
    same order every run, for one more matmul per iteration of the assignment's size.
    """
    if not fixed_order:
        return torch.zeros(num_clusters, unit.size(1), dtype=unit.dtype, device=unit.device).index_add_(0, ids, unit)
    sums = unit.new_zeros(num_clusters, unit.size(1))  # P x C
    clusters = torch.arange(num_clusters, device=unit.device)  # P
    rows = _chunk_rows(unit.size(1), num_clusters)
    for chunk, chunk_ids in zip(unit.split(rows), ids.split(rows)):
        one_hot = (chunk_ids.unsqueeze(1) == clusters).to(unit.dtype)  # rows x P
        sums += one_hot.t() @ chunk  # P x C
    return sums


def _assign(unit: Tensor, centroids: Tensor, stale: Tensor, rows: int, ids: Tensor, own: Tensor, rival: Tensor) -> bool:
    """Recompute the nearest centroid of the `stale` points (indices) and their exact bounds, in place.

    Returns whether any of them changed cluster.
    """
    # gathering the stale rows costs a copy; when most points are stale, multiplying all of them is cheaper
    everything = stale.numel() > unit.size(0) // 2
    changed = False
    for index in (torch.arange(unit.size(0), device=unit.device) if everything else stale).split(rows):
        chunk = unit[index[0] : index[-1] + 1] if everything else unit.index_select(0, index)  # n x C
        sims = chunk @ centroids.t()  # n x P
        best, nearest = sims.max(dim=1)  # n each
        if centroids.size(0) > 1:
            second = sims.scatter_(1, nearest.unsqueeze(1), -2.0).amax(dim=1)  # n, best of the others
        else:
            second = torch.full_like(best, -2.0)  # no rival: below any cosine
        changed = changed or bool((ids[index] != nearest).any())
        ids[index] = nearest
        own[index] = best
        rival[index] = second
    return changed
