"""Do the clusters answer? A QA checkpoint with long-range layers scored three ways on the same held-out questions:
the groups as trained (Cluster-Former's nearest centroids, LSH's buckets); each token's group replaced by a random one
of the same sizes (a seeded shuffle of the assignment within each sequence); and the identity order (every token in
one group: the stable sort keeps the original positions, and the layer attends over windows of neighbours).

    python -m benchmarks.qa_cluster_ablation data-bin/qa/budget/squad_article/bin \
        --path data-bin/qa/budget/article_cluster-layer6-bf16-attdrop0_seed1/checkpoint_last.pt \
        --max-examples 300 --cpu --autocast-bf16 --json cluster_ablation.json

Reading: if one converted layer's gain over `none` comes from grouping by content as it reads, both ablations fall
towards `none`'s score; if they keep most of it, the layer helped the model train, not read. The shuffle keeps every
group's size (so the windows' lengths and the padding are as trained) and only breaks which tokens share a window;
the identity order keeps the tokens' neighbours instead. Each pass is compared with the trained one per question
(difference and 95 % bootstrap interval over the questions), all passes over the same questions in the same batches;
the trained pass gives qa-predict's answers.
"""

from __future__ import annotations

import argparse
import types

import torch
from torch import Tensor

from benchmarks.qa_ablation_passes import add_common_args, check_common_args, load_model, run_passes
from fairseq_clusterformer.layers.sorted_window import SortedWindowLayer


def real_tokens(ids: Tensor, padding_mask: Tensor | None) -> Tensor:
    """B x T, True where a token is not padding."""
    return torch.ones_like(ids, dtype=torch.bool) if padding_mask is None else ~padding_mask


def shuffled_ids(ids: Tensor, padding_mask: Tensor | None, generator: torch.Generator) -> Tensor:
    """B x T: within each sequence, the real tokens' group ids permuted at random among the real tokens (each group
    keeps its size; pads keep theirs)."""
    out = ids.clone()
    real = real_tokens(ids, padding_mask)
    for b in range(ids.size(0)):
        positions = real[b].nonzero().squeeze(1)  # N: the real tokens of sequence b
        order = torch.randperm(positions.numel(), generator=generator).to(ids.device)
        out[b, positions] = ids[b, positions[order]]
    return out


def identity_ids(ids: Tensor, padding_mask: Tensor | None) -> Tensor:
    """B x T: every real token in group 0, pads where they were (after every real token): the stable sort is then the
    identity on the real tokens."""
    return torch.where(real_tokens(ids, padding_mask), torch.zeros_like(ids), ids)  # pads at P >= 1


def long_range_layers(model) -> list[SortedWindowLayer]:
    return [m for m in model.modules() if isinstance(m, SortedWindowLayer)]


def ablate(layers: list[SortedWindowLayer], how: str, seed: int) -> None:
    """Make every layer group its tokens ``how`` ("trained", "shuffled", "identity") from now on; eager, since the
    compiled forward would not see the replaced grouping."""
    generator = torch.Generator().manual_seed(seed)  # one stream for the pass: the same batches draw the same shuffles
    for layer in layers:
        layer.__dict__.pop("group_ids", None)  # the class's own assignment
        layer.compile_mode = "off"
        if how == "trained":
            continue
        trained = layer.group_ids

        def group_ids(self, x, padding_mask, trained=trained):
            ids = trained(x, padding_mask)  # B x T, pads at the group count
            if how == "identity":
                return identity_ids(ids, padding_mask)
            return shuffled_ids(ids, padding_mask, generator)

        layer.group_ids = types.MethodType(group_ids, layer)


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(parser, "clusterformer_qa checkpoint with long-range layers (cluster, lsh, sparse; any mode)")
    parser.add_argument("--seed", type=int, default=1, help="the shuffle's random seed")
    return parser


def main(args: argparse.Namespace) -> dict:
    check_common_args(args)
    model, task = load_model(args)
    layers = long_range_layers(model)
    if not layers:
        raise SystemExit(f"--path {args.path}: no long-range layer to ablate (trained with --long-range-layer none?)")
    kinds = sorted({layer.kind for layer in layers})
    print(f"| {len(layers)} long-range layer(s) of kind {', '.join(kinds)}; shuffle seed {args.seed}")
    passes = {how: (lambda how=how: ablate(layers, how, args.seed)) for how in ("trained", "shuffled", "identity")}
    return run_passes(model, task, args, passes, about={"kinds": kinds, "layers": len(layers), "seed": args.seed})


if __name__ == "__main__":
    main(get_parser().parse_args())
