"""The group assignment stays float32 where the rest of a model computes in lower precision: cluster and LSH ids under
bfloat16 autocast equal the float32 ids on near-tie inputs, and ``model.half()`` / ``.to(bfloat16)`` keep the
centroids, the cluster shares and LSH's hash directions float32, bit for bit."""

import torch

from fairseq_clusterformer.layers.baselines import LSHLayer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.ops.clustering import assign_clusters
from fairseq_clusterformer.ops.lsh import lsh_buckets, random_rotations
from tests.test_model import build


def near_tie_inputs():
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(4, 1024, 64, generator=gen)  # B x T x C: 4,096 tokens
    centroids = torch.randn(64, 64, generator=gen)  # P x C
    return states, centroids, random_rotations(64, 64, gen)


def test_cluster_and_lsh_ids_under_bf16_autocast_equal_the_float32_ids():
    states, centroids, rotations = near_tie_inputs()
    clusters, buckets = assign_clusters(states, centroids), lsh_buckets(states, rotations)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(assign_clusters(states, centroids), clusters)
        assert torch.equal(lsh_buckets(states, rotations), buckets)
        # the inputs are sensitive: the same products in autocast's precision put tokens elsewhere
        rounded = torch.matmul(torch.nn.functional.normalize(states), torch.nn.functional.normalize(centroids).t())
        assert rounded.dtype == torch.bfloat16 and (rounded.argmax(-1) != clusters).sum() > 10


def test_model_half_keeps_centroids_shares_and_hash_directions_float32_bit_for_bit(lm_data):
    _, model = build(lm_data)
    layers = [m for m in model.modules() if isinstance(m, ClusterFormerLayer)]
    assert layers
    for layer in layers:
        # values with mantissa bits that half precision cannot hold
        layer.set_centroids(torch.nn.functional.normalize(torch.randn_like(layer.centroids), dim=-1) / 3)
    before = [(layer.centroids.clone(), layer.shares.clone()) for layer in layers]
    assert not torch.equal(before[0][0].half().float(), before[0][0])
    model.half()
    assert next(model.parameters()).dtype == torch.float16  # the rest of the model did convert
    for layer, (centroids, shares) in zip(layers, before):
        assert layer.centroids.dtype == layer.shares.dtype == torch.float32
        assert torch.equal(layer.centroids, centroids) and torch.equal(layer.shares, shares)
    model.to(torch.bfloat16)
    assert torch.equal(layers[0].centroids, before[0][0])

    _, lsh_model = build(lm_data, "--long-range-layer", "lsh")
    lsh = next(m for m in lsh_model.modules() if isinstance(m, LSHLayer))
    rotations = lsh.eval_rotations.clone()
    lsh_model.half()
    assert lsh.eval_rotations.dtype == torch.float32 and torch.equal(lsh.eval_rotations, rotations)
