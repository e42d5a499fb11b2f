"""The paper's long-range baselines on the shared sort / window / unsort path.

B = batch, T = tokens, C = channels, P = buckets.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fairseq_clusterformer.layers.cluster import Float32Buffers
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.sorted_window import ContentGroupedLayer, SortedWindowLayer
from fairseq_clusterformer.layers.streams import DrawCounter
from fairseq_clusterformer.ops.lsh import lsh_buckets, offset_groups, random_rotations

# evaluation hashes with fixed directions, so that a checkpoint scores the same text the same way every time
EVAL_ROTATION_SEED = 20200121


class LSHLayer(Float32Buffers, ContentGroupedLayer):
    """Reformer-style buckets from random rotations, as many as --num-clusters.

    Training draws new directions at every forward pass, from the layer's own stream (``layers.streams``: seeded from
    torch's seed, which fairseq sets at every update, so runs and resumed runs repeat; torch's global stream is not
    touched, so the dropout masks are those of the sliding-window model of the same seed). A forward pre-hook draws
    them into ``train_rotations`` outside the compiled part of the layer (``--compile-layers`` traces no generator).
    Evaluation uses directions drawn once from a fixed seed. Both are non-persistent buffers: not in checkpoints.
    The strict mode groups consecutive bucket numbers with equal shares (random directions fill their buckets
    evenly on average).
    """

    kind = "lsh"
    float32_buffers = ("eval_rotations", "train_rotations")

    @classmethod
    def check_num_groups(cls, num_groups: int) -> None:
        if num_groups % 2:
            raise ValueError(
                "--num-clusters must be an even number >= 2 for --long-range-layer lsh (angular LSH draws "
                f"--num-clusters / 2 random directions and takes the argmax over them and their negatives), got "
                f"{num_groups}"
            )

    def __init__(
        self,
        settings: LayerSettings,
        num_buckets: int,
        causality: str = "strict",
        num_band_groups: int = 1,
        values: str = "own",
        stream: int = 0,
    ) -> None:
        super().__init__(settings, num_buckets, causality, num_band_groups, values)
        generator = torch.Generator().manual_seed(EVAL_ROTATION_SEED)
        eval_rotations = random_rotations(settings.embed_dim, num_buckets, generator)  # C x P/2
        self.register_buffer("eval_rotations", eval_rotations, persistent=False)
        self.register_buffer("train_rotations", torch.zeros_like(eval_rotations), persistent=False)
        self.drawn = False  # a training-mode group_ids before the first draw would hash with zeros: it refuses
        self.draws = DrawCounter(stream)
        self.register_forward_pre_hook(_draw_training_rotations)

    @torch.no_grad()
    def draw_rotations(self) -> Tensor:
        """New training directions (C x P/2) from the layer's own stream into ``train_rotations``."""
        self.drawn = True
        return self.train_rotations.normal_(generator=self.draws.next_generator(self.train_rotations.device))

    def group_ids(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        if self.training and not self.drawn:
            raise RuntimeError("LSHLayer.group_ids in training before any training forward: call draw_rotations()")
        return lsh_buckets(x, self.train_rotations if self.training else self.eval_rotations, padding_mask)


def _draw_training_rotations(layer: LSHLayer, args: tuple) -> None:
    """Forward pre-hook: every training forward hashes with new directions (a module function: layers pickle)."""
    if layer.training:
        layer.draw_rotations()


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
