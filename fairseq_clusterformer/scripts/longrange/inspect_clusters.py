"""Show what the long-range layers of a trained model do with one document (the paper's Table 4).

    fairseq-clusterformer-inspect --path checkpoints/checkpoint_best.pt --data data-bin/wikitext-103 \
        --document article.txt --png clusters.png

Runs the document's first segment through the decoder layer by layer. At every long-range layer it prints, for the
largest clusters (or those named by --show), the words whose input states landed there and their positions in the
document; and it writes a PNG with (a) the cluster-size histogram per long-range layer and (b) the distribution of
the distances between a token and the keys it attends to in that layer, against the sliding window's reach.
Cluster ids come from the layer itself (``group_ids``, i.e. ``cluster_ids`` for Cluster-Former) and the attended
keys from its own ``WindowScheme.mask``: nothing is re-implemented here.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from fairseq_clusterformer.layers.sorted_window import SortedWindowLayer
from fairseq_clusterformer.lm.model import ClusterFormerLanguageModel
from fairseq_clusterformer.ops import cluster_stats as stats
from fairseq_clusterformer.scripts.model_loading import load_checkpoint

# how the byte-level (enwik8-style) dictionaries' invisible characters are shown
VISIBLE = {" ": "\u2423", "\t": "\u21e5"}


@dataclass
class LayerReport:
    number: int  # 1-based layer number
    kind: str
    ids: Tensor  # T cluster ids
    sizes: Tensor  # P
    distances: Tensor  # query - key of every attended pair
    window: int
    layers_below: int


def read_document(path: Path, dictionary, as_bytes: bool, limit: int) -> tuple[Tensor, list[str]]:
    """Token ids (T) and the matching words, tokenised as fairseq-preprocess does (one end-of-line token per line);
    with ``as_bytes`` one token per byte, as prepare_enwik8 writes them."""
    if not path.is_file():
        raise FileNotFoundError(f"--document {path}: no such file")
    ids: list[int] = []
    words: list[str] = []
    if as_bytes:
        for value in path.read_bytes()[:limit]:
            ids.append(dictionary.eos() if value == 10 else dictionary.index(str(value)))
            words.append("</s>" if value == 10 else VISIBLE.get(chr(value), chr(value)))
    else:
        for line in path.read_text(encoding="utf-8").splitlines():
            encoded = dictionary.encode_line(line, add_if_not_exist=False, append_eos=True)
            ids += encoded.tolist()
            words += [*line.split(), "</s>"]
            if len(ids) >= limit:
                break
    if not ids:
        raise ValueError(f"--document {path} is empty")
    return torch.tensor(ids[:limit]), words[:limit]


@torch.no_grad()
def run_layers(decoder, tokens: Tensor) -> list[LayerReport]:
    """Run the decoder on one segment (T tokens) layer by layer; report every long-range layer."""
    tokens = tokens.unsqueeze(0)  # 1 x T
    padding_mask = tokens.eq(decoder.padding_idx)  # 1 x T
    valid = ~padding_mask
    x = decoder.embed(tokens)  # 1 x T x C
    reports = []
    for index, layer in enumerate(decoder.layers):
        if isinstance(layer, SortedWindowLayer):
            s = layer.settings
            ids = layer.group_ids(x, padding_mask)  # 1 x T, the layer's own assignment
            pairs = torch.zeros(1, tokens.size(1), tokens.size(1), dtype=torch.bool)  # 1 x T x T
            for q_pos, k_pos, allowed in layer.attention_layouts(ids, padding_mask):  # one per head set
                pairs |= stats.attended_pairs(q_pos, k_pos, allowed, tokens.size(1), valid)
            reports.append(
                LayerReport(
                    number=index + 1,
                    kind=type(layer).__name__,
                    ids=ids[0],
                    sizes=stats.cluster_sizes(ids, layer.num_groups),
                    distances=stats.attention_distances(pairs),
                    window=s.window_size,
                    layers_below=index,
                )
            )
        x = layer(x, padding_mask)
    return reports


def print_report(report: LayerReport, words: list[str], show: list[int], count: int, max_words: int) -> None:
    sizes = report.sizes
    filled = sizes[sizes > 0]
    one, below = stats.window_reach(report.window), stats.window_reach(report.window, report.layers_below)
    print(
        f"layer {report.number} ({report.kind}): {int(sizes.sum())} tokens in {filled.numel()} of {sizes.numel()} "
        f"clusters (sizes {int(filled.min())} / {int(filled.median())} / {int(filled.max())} min / median / max); "
        f"{stats.fraction_beyond(report.distances, one):.1%} of the attended keys lie beyond one window "
        f"({one} tokens), {stats.fraction_beyond(report.distances, below):.1%} beyond the reach of the "
        f"{report.layers_below} layer(s) below ({below} tokens)"
    )
    for cluster in show or stats.largest_clusters(sizes, count):
        if not 0 <= cluster < sizes.numel():
            raise ValueError(f"--show {cluster}: layer {report.number} has clusters 0..{sizes.numel() - 1}")
        positions = stats.cluster_positions(report.ids, cluster).tolist()
        shown = positions[:max_words]
        more = f" (+{len(positions) - len(shown)} more)" if len(positions) > len(shown) else ""
        print(f"  cluster {cluster} ({len(positions)} tokens)")
        print(f"    words: {' '.join(words[p] for p in shown)}{more}")
        print(f"    positions: {', '.join(str(p) for p in shown)}{more}")


def write_png(reports: list[LayerReport], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(2, len(reports), figsize=(5 * len(reports), 7), squeeze=False)
    for column, report in enumerate(reports):
        top, bottom = axes[0][column], axes[1][column]
        top.bar(range(report.sizes.numel()), report.sizes.tolist(), width=1.0)
        top.set(title=f"layer {report.number}: cluster sizes", xlabel="cluster id", ylabel="tokens")
        distances = report.distances.tolist() or [0]
        bottom.hist(distances, bins=50, color="tab:gray")
        one, below = stats.window_reach(report.window), stats.window_reach(report.window, report.layers_below)
        bottom.axvline(one, color="tab:red", linestyle="--", label=f"one window ({one})")
        bottom.axvline(below, color="tab:orange", linestyle=":", label=f"layers below: {report.layers_below} ({below})")
        bottom.set(title=f"layer {report.number}: query - key distance", xlabel="tokens back", ylabel="pairs")
        bottom.set_yscale("log")
        bottom.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=80)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", type=Path, required=True, help="a clusterformer_lm checkpoint")
    parser.add_argument("--data", type=Path, required=True, help="the binarised data folder (its dict.txt)")
    parser.add_argument("--document", type=Path, required=True, help="a text file; its first segment is shown")
    parser.add_argument("--png", type=Path, default=Path("clusters.png"), help="where the figure is written")
    parser.add_argument("--tokens", type=int, default=0, help="segment length (default: training's)")
    parser.add_argument("--clusters", type=int, default=4, help="how many of the largest clusters to print")
    parser.add_argument("--show", default="", help="comma-separated cluster ids to print instead")
    parser.add_argument("--max-words", type=int, default=40, help="words printed per cluster")
    parser.add_argument("--bytes", action="store_true", help="byte-level model (enwik8): one token per byte")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # fairseq, faiss and matplotlib log at INFO / DEBUG while loading: keep the report readable
    logging.basicConfig(level=logging.WARNING, force=True)
    from fairseq import checkpoint_utils

    try:
        show = [int(item) for item in args.show.split(",") if item.strip()]
    except ValueError:
        print(f"inspect: --show must be comma-separated cluster ids, got {args.show!r}", file=sys.stderr)
        return 2
    for flag, path in (("--path", args.path), ("--data", args.data / "dict.txt")):
        if not path.is_file():
            print(f"inspect: {flag}: {path} not found", file=sys.stderr)
            return 2
    if args.png.is_dir():
        print(f"inspect: --png {args.png}: is a directory; give the path of a file", file=sys.stderr)
        return 2
    overrides = {"data": str(args.data)}
    needed = "inspect needs a clusterformer_lm checkpoint (--arch clusterformer_lm_*): only its layers have clusters"
    try:
        state = load_checkpoint(args.path, overrides, ClusterFormerLanguageModel, needed)
    except ValueError as error:
        print(f"inspect: {error}", file=sys.stderr)
        return 2
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(args.path)], overrides, state=state)
    model = models[0].eval()
    limit = args.tokens or int(cfg.task.tokens_per_sample)
    try:
        tokens, words = read_document(args.document, task.source_dictionary, args.bytes, limit)
        reports = run_layers(model.decoder, tokens)
        if not reports:
            raise ValueError(f"{args.path} has no long-range layers (trained with --long-range-layer none?)")
        print(f"{args.document}: first {tokens.numel()} tokens")
        for report in reports:
            print_report(report, words, show, args.clusters, args.max_words)
    except (OSError, ValueError) as error:
        print(f"inspect: {error}", file=sys.stderr)
        return 2
    write_png(reports, args.png, f"{args.path.name} on {args.document.name} ({tokens.numel()} tokens)")
    print(f"figure: {args.png}")
    return 0


def cli_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli_main()
