"""The paper's long-range baselines on the shared sort / window / unsort path.

B = batch, T = tokens, C = channels, P = buckets.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fairseq_clusterformer.layers.cluster import Float32Buffers
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.sorted_window import NeighbourGroupLayer, SortedWindowLayer
from fairseq_clusterformer.ops.lsh import lsh_buckets, offset_groups, random_rotations

# evaluation hashes with fixed directions, so that a checkpoint scores the same text the same way every time
EVAL_ROTATION_SEED = 20200121


class LSHLayer(Float32Buffers, NeighbourGroupLayer):
    """Reformer-style buckets from random rotations, as many as --num-clusters.

    Training draws new directions every forward pass from torch's RNG (which fairseq seeds, so runs repeat);
    evaluation uses directions drawn once from a fixed seed. They are a non-persistent buffer: not in checkpoints.
    The strict mode groups consecutive bucket numbers with equal shares (random directions fill their buckets
    evenly on average).
    """

    kind = "lsh"
    float32_buffers = ("eval_rotations",)

    def __init__(
        self,
        settings: LayerSettings,
        num_buckets: int,
        causality: str = "strict",
        band_groups: int = 1,
        values: str = "own",
    ) -> None:
        super().__init__(settings, num_buckets, causality, band_groups, values)
        generator = torch.Generator().manual_seed(EVAL_ROTATION_SEED)
        self.register_buffer(
            "eval_rotations", random_rotations(settings.embed_dim, num_buckets, generator), persistent=False
        )

    def group_ids(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        if self.training:
            rotations = random_rotations(x.size(-1), self.num_groups, device=x.device)  # C x P/2
        else:
            rotations = self.eval_rotations
        return lsh_buckets(x, rotations, padding_mask)


class StridedSparseLayer(SortedWindowLayer):
    """Sparse Transformer's strided pattern as the paper re-implements it: a token attends across windows to the
    tokens at the same offset inside their window, i.e. to positions t - k*m for stride m (k < l in strict mode)."""

    kind = "sparse"

    def __init__(self, settings: LayerSettings, causality: str = "strict", values: str = "own") -> None:
        super().__init__(settings, settings.window_stride, causality, values=values)

    def group_ids(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        return offset_groups(x.size(0), x.size(1), self.num_groups, padding_mask, device=x.device)

    def step_group_ids(self, x: Tensor, position: int) -> Tensor:
        # the group is the offset t mod m of the token's position, not of its place in a one-token input
        return torch.full((x.size(0), 1), position % self.num_groups, dtype=torch.long, device=x.device)  # B x 1
