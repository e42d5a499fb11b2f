"""How many keys a long-range layer lets each query see, and how far back they lie, per causality mode.

B = batch (1), T = tokens, P = clusters.

Counts come from the layer's own layout (``SortedWindowLayer.attention_layouts``: the windows, the sort and the
masks the forward pass uses), on cluster ids drawn at random: every cluster equally likely ("uniform"), or with
Zipf sizes (share of the r-th largest proportional to 1/r, in a random cluster order: "skewed"). The strict mode's
groups are cut with the shares the ids were drawn from (what the memory bank measures at a refresh); the row
"skewed, equal shares" cuts them as if every cluster were equally large (before the first refresh, or when the
bank is stale). Rows:
- paper: the paper's windows of the sorted sequence, each key at a position <= the query's (leaks the future);
- strict: the groups of neighbouring clusters (per head set; "union" = keys any head sees);
- own cluster: the earlier strict mode (the l - 1 most recent tokens of the query's own cluster).
"beyond l" is the share of attended keys at least one window (l tokens) back, out of a sliding window's reach.

    OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks.causal_reach --out benchmarks/results/causal_reach.md
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.ops import cluster_stats as stats
from fairseq_clusterformer.ops.cluster_groups import default_groups, segment_groups, uniform_shares


def zipf_shares(clusters: int, generator: torch.Generator) -> torch.Tensor:
    ranks = torch.randperm(clusters, generator=generator).double() + 1  # P, random order of the sizes
    return (1 / ranks / (1 / ranks).sum()).float()


def pairs_of(layer: ClusterFormerLayer, ids: torch.Tensor) -> list[torch.Tensor]:
    """1 x T x T attended pairs per head set."""
    length = ids.size(1)
    return [stats.attended_pairs(q, k, allowed, length) for q, k, allowed in layer.attention_layouts(ids, None)]


def summarise(pairs: list[torch.Tensor], window: int) -> dict:
    """Mean keys per query (averaged over head sets), share of queries that see only themselves, share beyond l."""
    keys = torch.stack([p[0].sum(-1).double() for p in pairs])  # n x T
    distances = torch.cat([stats.attention_distances(p) for p in pairs])
    return {
        "keys": float(keys.mean()),
        "alone": float((keys == 1).double().mean()),
        "beyond": stats.fraction_beyond(distances, window - 1),
    }


def measure(length: int, window: int, stride: int, clusters: int, heads: int, sizes: str, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    shares = uniform_shares(clusters) if sizes == "uniform" else zipf_shares(clusters, gen)
    ids = torch.multinomial(shares.double(), length, replacement=True, generator=gen)[None]  # 1 x T
    settings = LayerSettings(16, 32, heads, window, stride)
    groups = default_groups(length, window, clusters)
    row = {}
    for mode in ("paper", "strict"):
        layer = ClusterFormerLayer(settings, clusters, mode, groups)
        layer.set_centroids(layer.centroids, uniform_shares(clusters) if sizes == "skewed, equal shares" else shares)
        pairs = pairs_of(layer, ids)
        row[mode] = summarise(pairs, window)
        if mode == "strict":
            union = [torch.stack(pairs).any(0)]
            row["union"] = summarise(union, window)
            layer.group_table = torch.arange(clusters)[None]  # one group per cluster: the earlier strict mode
            row["own"] = summarise(pairs_of(layer, ids), window)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--length", type=int, default=3072)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--stride", type=int, default=128)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--clusters", default="64,256,512")
    p.add_argument("--seeds", type=int, default=3, help="draws of the ids per row (mean shown)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    lines = [
        f"T = {args.length}, l = {args.window}, m = {args.stride}, {args.heads} heads (2 head sets), "
        f"{segment_groups(args.length, args.window)} groups; mean over {args.seeds} draws of the cluster ids.",
        "",
        "| clusters | sizes | keys/query paper | strict | strict/paper | strict, union of heads | own cluster "
        "| only itself: paper / strict / own | beyond l: paper / strict / own |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for clusters in (int(v) for v in args.clusters.split(",")):
        for sizes in ("uniform", "skewed", "skewed, equal shares"):
            rows = [
                measure(args.length, args.window, args.stride, clusters, args.heads, sizes, seed)
                for seed in range(args.seeds)
            ]

            def mean(mode: str, field: str, rows=rows) -> float:
                return sum(r[mode][field] for r in rows) / len(rows)

            lines.append(
                f"| {clusters} | {sizes} | {mean('paper', 'keys'):.1f} | {mean('strict', 'keys'):.1f} "
                f"| {mean('strict', 'keys') / mean('paper', 'keys'):.2f} | {mean('union', 'keys'):.1f} "
                f"| {mean('own', 'keys'):.1f} "
                f"| {mean('paper', 'alone'):.1%} / {mean('strict', 'alone'):.1%} / {mean('own', 'alone'):.1%} "
                f"| {mean('paper', 'beyond'):.1%} / {mean('strict', 'beyond'):.1%} / {mean('own', 'beyond'):.1%} |"
            )
            print(lines[-1], flush=True)
    lines += ["", f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}."]
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
