"""The faiss backend of the spherical K-Means refresh, pinned to the GPU of the states it clusters.

Pure torch + numpy + faiss (handed in by the caller, which imports it lazily); never imports fairseq.

N = states in the bank, P = number of clusters, C = model dim.

Why not ``faiss.Kmeans(..., gpu=True)``: faiss reads ``gpu=True`` as "every visible GPU" and ``gpu=1`` as "the first
one", so in a distributed run (every rank sees all GPUs, each trains on its own) rank 0's refresh would allocate on
the other ranks' devices, or on GPU 0 whatever rank runs it. Building the index here puts it on the states' own
device, and the CPU path stays what ``faiss.Kmeans`` computes (same parameters, same inner-product index).
"""

from __future__ import annotations

import logging
import math
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

logger = logging.getLogger(__name__)


def faiss_placement(faiss: ModuleType, device: torch.device) -> tuple[int | None, str]:
    """Where faiss clusters states that live on ``device``: (GPU ordinal, "") or (None, why it is the CPU).

    The CPU when the states are not on a CUDA device, or when this faiss has no GPU support (faiss-cpu) or sees no
    GPU; the reason is empty when the CPU is simply where the states are.
    """
    if device.type != "cuda":
        return None, ""
    if not hasattr(faiss, "StandardGpuResources"):
        return None, "this faiss was built without GPU support (faiss-cpu)"
    if faiss.get_num_gpus() < 1:
        return None, "faiss sees no GPU"
    return (device.index if device.index is not None else torch.cuda.current_device()), ""


def faiss_spherical_kmeans(
    faiss: ModuleType, states: Tensor, num_clusters: int, iters: int, seed: int, init: Tensor | None
) -> Tensor:
    """Spherical K-Means of N x C ``states`` into P unit-norm centroids (P x C float32, on the states' device), with
    faiss's Lloyd iterations on the states' GPU when faiss can run there, else on the CPU (logged when the states were
    on a GPU: install faiss-gpu, or use ``--kmeans-backend torch``, which runs on the GPU without faiss)."""
    num, dim = states.shape
    unit = F.normalize(states.detach().float(), dim=-1).cpu().numpy()  # N x C
    params = faiss.ClusteringParameters()
    params.niter = iters
    params.seed = seed
    params.spherical = True
    params.verbose = False
    # faiss silently trains on a random subset of max_points_per_centroid * P states (default 256 * P, i.e. only 16k
    # of a 100k bank for 64 clusters); the whole bank is the point of keeping one.
    params.max_points_per_centroid = math.ceil(num / num_clusters)
    # Below min_points_per_centroid * P states faiss only prints a warning; a small bank is legitimate here.
    params.min_points_per_centroid = 1
    clustering = faiss.Clustering(dim, num_clusters, params)
    if init is not None:
        faiss.copy_array_to_vector(init.detach().float().cpu().numpy().ravel(), clustering.centroids)
    index = faiss.IndexFlatIP(dim)  # nearest centroid by inner product, as faiss.Kmeans does for spherical
    gpu, why_cpu = faiss_placement(faiss, states.device)
    resources = None  # must outlive the GPU index
    if gpu is not None:
        resources = faiss.StandardGpuResources()
        index = faiss.index_cpu_to_gpu(resources, gpu, index)
    elif why_cpu:
        logger.warning(
            f"--kmeans-backend faiss with states on {states.device}: {why_cpu}, so K-Means runs on the CPU "
            "(install faiss-gpu, or use --kmeans-backend torch, which runs on the GPU)"
        )
    clustering.train(unit, index)
    del resources
    centroids = faiss.vector_to_array(clustering.centroids).reshape(num_clusters, dim)  # P x C
    # faiss's spherical mode normalises after every update; normalising again only removes float rounding.
    return F.normalize(torch.from_numpy(centroids).float(), dim=-1).to(states.device)
