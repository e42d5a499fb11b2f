"""fairseq-clusterformer-qa-reach: where a clusterformer_qa model's question tokens look, layer by layer: how much of
their attention lands in the gold answer's paragraph, and how much lies outside their own sliding window.

    fairseq-clusterformer-qa-reach data-bin/squad-articles --path checkpoints/checkpoint_last.pt --split valid \
        --max-examples 200 --json reach.json

The encoder runs on one example at a time, as prediction runs it. Forward pre-hooks on the long-range layers
(Cluster-Former, LSH, sparse) capture each one's input states and padding mask; the layer's own ``group_ids`` and
``attention_layouts`` then give its clusters and who attends to whom (the forward pass itself is untouched). The
sliding-window layers' pairs come from the encoder's own window layout and mask (``QAWindows``): the question copy
of window k sees window k's question block and context tokens, the same in every sliding-window layer.

Per layer, averaged over the questions (one with no gold answer in the model's context is left out and counted):
cluster (bucket) sizes over the real context tokens (entropy in bits, largest share, empty clusters); of the context
keys the question tokens attend to, the share in the gold answer's paragraph against the uniform share (paragraph
length / context length); the share of their keys outside their own sliding window (what the layer adds over it; 0
for the sliding window) and of those, the share in the answer's paragraph; for a hybrid layer (``--long-range-mode
hybrid``) also its gates, how much of that far attention each head adds to its sliding window. docs/qa.md says
more. A checkpoint trained with --long-range-layer none has the sliding-window row only.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fairseq_clusterformer.layers.sorted_window import SortedWindowLayer
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from fairseq_clusterformer.ops import cluster_stats as stats
from fairseq_clusterformer.qa.model import ClusterFormerQAModel
from fairseq_clusterformer.qa.ops.windows import QALayout, QAWindows, close_context, qa_tokens
from fairseq_clusterformer.qa.scripts.reach_row import Row
from fairseq_clusterformer.scripts.cli_logging import run_cli
from fairseq_clusterformer.scripts.model_loading import load_model

logger = logging.getLogger("fairseq_clusterformer.qa_reach")


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairseq-clusterformer-qa-reach", description=__doc__.split("\n")[0])
    parser.add_argument("data", help="directory written by fairseq-clusterformer-qa-binarize")
    parser.add_argument("--path", required=True, help="clusterformer_qa checkpoint")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--max-examples", type=int, help="only the split's first N kept examples (default: all)")
    parser.add_argument("--max-context-eval", type=int, help="longest context (default: the checkpoint's task's)")
    parser.add_argument("--json", help="also write the statistics to this file")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    parser.add_argument(
        "--autocast-bf16",
        action="store_true",
        help="run the layers under torch.autocast(bfloat16) (heads in float32): faster on a GPU and on a CPU with "
        "native bfloat16 (AVX512-BF16 / AMX); warns, naming both matmul rates, where bfloat16 is slower",
    )
    return parser


def load(args: argparse.Namespace):
    overrides: dict[str, Any] = {"data": args.data, "roberta_path": None}  # the checkpoint holds every weight
    if args.max_context_eval is not None:
        overrides["max_context_eval"] = args.max_context_eval
    bf16 = getattr(args, "autocast_bf16", False)  # callers that build their own Namespace may leave it out
    needed = "qa-reach needs a clusterformer_qa checkpoint (trained with --task clusterformer_qa)"
    return load_model(args.path, overrides, ClusterFormerQAModel, needed, args.cpu, bf16)


def gold_paragraphs(sample: dict[str, Any], length: int) -> list[tuple[int, int]]:
    """The [start, stop) paragraphs of the one example of ``sample`` that hold its gold spans (or long answer)."""
    starts = [s for s in sample["meta"][0].get("paragraph_starts", []) if s < length]
    golds = [int(start) for start, _ in sample["spans"][0].tolist() if start >= 0]
    if not golds and int(sample["long_answer"][0]) >= 0:
        golds = [starts[int(sample["long_answer"][0])]] if int(sample["long_answer"][0]) < len(starts) else []
    return stats.paragraphs_of(starts, length, golds)


def window_pairs(layout: QALayout, valid: Tensor, rows: Tensor) -> Tensor:
    """B x N x S: the keys the N flat slots ``rows`` see in every sliding-window layer, from the encoder's window
    scheme and mask."""
    slots = layout.window_slots(valid.device).expand(valid.size(0), -1, -1)  # B x K x W; sentinel S is dropped
    allowed = QAWindows(layout).mask(slots, valid, False)  # B x K x W x W
    return stats.attended_rows(slots, slots, allowed, layout.flat_len, rows, valid)


def layer_pairs(layer: SortedWindowLayer, x: Tensor, padding_mask: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """(B x S group ids, B x N x S keys of the slots ``rows``) of a long-range layer on its captured input."""
    ids = layer.group_ids(x, padding_mask)  # B x S, the assignment the forward pass made
    pairs = torch.zeros(x.size(0), rows.numel(), x.size(1), dtype=torch.bool, device=x.device)  # B x N x S
    for q_pos, k_pos, allowed in layer.attention_layouts(ids, padding_mask):  # one per head set
        pairs |= stats.attended_rows(q_pos, k_pos, allowed, x.size(1), rows, ~padding_mask)
    return ids, pairs


@torch.no_grad()
def measure(model, task, split: str, max_examples: int | None) -> tuple[list[Row], int, dict[str, int], list[int]]:
    """(rows: sliding window first, questions measured, left out by reason, sliding-window layer numbers)."""
    encoder = model.encoder.sentence_encoder
    long_range: list[tuple[int, SortedWindowLayer]] = []
    sliding: list[int] = []
    for number, layer in enumerate(encoder.layers, start=1):
        if isinstance(layer, SortedWindowLayer):
            long_range.append((number, layer))
        elif isinstance(layer, SlidingWindowLayer):
            sliding.append(number)
        else:
            raise ValueError(f"layer {number} is a {type(layer).__name__}: qa-reach knows no attention layout for it")
    window_row = Row("sliding window", "sliding_window")
    rows = {number: Row(str(number), layer.kind, layer.num_groups) for number, layer in long_range}
    for number, layer in long_range:
        if getattr(layer, "hybrid", False):  # the far branch's weight: the statistics below say where it looks
            rows[number].gates = layer.head_gates().tolist()
    captured: dict[int, tuple[Tensor, Tensor]] = {}

    def capture(number: int):
        def hook(module, inputs):  # the encoder calls a long-range layer as layer(x, flat_pad)
            captured[number] = (inputs[0], inputs[1])

        return hook

    handles = [layer.register_forward_pre_hook(capture(number)) for number, layer in long_range]
    task.load_dataset(split)
    dataset = task.dataset(split)
    device = next(model.parameters()).device
    count = len(dataset) if max_examples is None else min(max_examples, len(dataset))
    measured, left_out = 0, {"no_gold_answer_in_context": 0}
    try:
        for index in range(count):
            sample = dataset.collater([dataset[index]])
            question = sample["net_input"]["question"].to(device)  # 1 x q
            context = sample["net_input"]["context"].to(device)  # 1 x n
            length = context.size(1)
            paragraphs = gold_paragraphs(sample, length)
            if not paragraphs:
                left_out["no_gold_answer_in_context"] += 1
                continue
            captured.clear()
            encoder.forward_qa(question, context)
            closed = close_context(context, encoder.eos, encoder.padding_idx)  # 1 x (n+1), as the encoder closes it
            layout = encoder.layout(question, closed)
            flat, _ = qa_tokens(question, closed, layout, encoder.bos, encoder.eos, encoder.padding_idx)  # 1 x S
            valid = flat.ne(encoder.padding_idx)  # 1 x S
            # the question tokens (after <s>) of every window's copy: the query rows of the statistics
            copies = torch.arange(layout.count, device=device)[:, None] * layout.chunk  # K x 1
            rows_q = (copies + 1 + torch.arange(question.size(1), device=device)[None, :]).reshape(-1)  # K*q
            slots = layout.context_slots(device)[:length]  # n flat slots of the real context tokens
            context_keys = torch.zeros(1, layout.flat_len, dtype=torch.bool, device=device)  # 1 x S
            context_keys[0, slots] = True
            paragraph_keys = torch.zeros_like(context_keys)  # 1 x S
            in_paragraph = stats.span_mask(length, paragraphs).to(device)  # n
            paragraph_keys[0, slots[in_paragraph]] = True
            uniform = int(in_paragraph.sum()) / length
            own = window_pairs(layout, valid, rows_q)  # 1 x K*q x S
            window_row.add(own, own, context_keys, paragraph_keys, uniform)
            for number, layer in long_range:
                x, padding_mask = captured[number]
                ids, pairs = layer_pairs(layer, x, padding_mask, rows_q)
                rows[number].add(pairs, own, context_keys, paragraph_keys, uniform)
                sizes = stats.cluster_sizes(ids[0, slots], layer.num_groups)  # P, real context tokens only
                rows[number].sizes.append(stats.size_summary(sizes))
            measured += 1
            if measured % 100 == 0:
                logger.info(f"{measured} of {count} examples measured")
    finally:
        for handle in handles:
            handle.remove()
    return [window_row, *rows.values()], measured, left_out, sliding


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(report: dict[str, Any]) -> None:
    print(
        f"{report['checkpoint']} on {report['data']} ({report['split']}): {report['questions']} questions, "
        f"--long-range-layer {report['long_range_layer']}, windows of {report['window_size']} context tokens, stride "
        f"{report['window_stride']}; left out: {report['left_out']}"
    )
    print(
        "shares of the keys that question tokens attend to; uniform = answer paragraph length / context length "
        f"(mean {fmt(report['uniform_paragraph_share'])})"
    )
    print(
        f"{'layer':<22}{'kind':<16}{'questions':>10}{'in answer par.':>16}{'uniform':>9}{'outside window':>16}"
        f"{'of those in par.':>18}{'uniform':>9}{'entropy bits':>14}{'largest':>9}{'empty':>7}"
    )
    for row in report["rows"]:
        name = row["layer"] if row["kind"] != "sliding_window" else f"window ({row['layers'] or '-'})"
        entropy = f"{fmt(row['entropy_bits'], 2)}/{fmt(row['max_entropy_bits'], 2)}" if "clusters" in row else "-"
        print(
            f"{name:<22}{row['kind']:<16}{row['questions']:>10}{fmt(row['paragraph_share']):>16}"
            f"{fmt(row['uniform_share']):>9}{fmt(row['outside_window_share']):>16}"
            f"{fmt(row['outside_window_paragraph_share']):>18}{fmt(row['outside_window_uniform_share']):>9}"
            f"{entropy:>14}{fmt(row.get('largest_share')):>9}{fmt(row.get('empty_clusters'), 1):>7}"
        )
    for row in report["rows"]:
        if "far_gates" in row:
            gates = " ".join(f"{g:+.2f}" for g in row["far_gates"])
            print(
                f"layer {row['layer']} (hybrid): far attention added per head, tanh(gain * gate): {gates} "
                f"(mean |gate| {fmt(row['mean_abs_far_gate'])}; 0 = the sliding window alone)"
            )
    if len(report["rows"]) == 1:
        print("no long-range layer: the sliding window's keys only (its outside-window share is 0 by construction)")


def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.max_examples is not None and args.max_examples < 1:
        raise ValueError(f"--max-examples must be at least 1, got {args.max_examples}")
    if args.json is not None and (Path(args.json).is_dir() or not Path(args.json).parent.is_dir()):
        raise ValueError(f"--json {args.json}: give the path of a file in an existing folder")
    for flag, path in (("--path", Path(args.path)), ("data", Path(args.data) / "qa_config.json")):
        if not path.is_file():
            raise ValueError(f"{flag}: {path} not found")
    model, cfg, task = load(args)
    rows, measured, left_out, sliding = measure(model, task, args.split, args.max_examples)
    if measured == 0:
        raise ValueError(f"--split {args.split}: no example with a gold answer in the model's context ({left_out})")
    summaries = [row.summary() for row in rows]
    summaries[0]["layers"] = ",".join(map(str, sliding))
    settings = model.encoder.sentence_encoder.settings
    report = {
        "checkpoint": str(args.path),
        "data": str(args.data),
        "split": args.split,
        "long_range_layer": str(cfg.model.long_range_layer),
        "window_size": settings.window_size,
        "window_stride": settings.window_stride,
        "questions": measured,
        "left_out": left_out,
        # every measured question has context keys in its sliding window: the uniform share over all of them
        "uniform_paragraph_share": summaries[0]["uniform_share"],
        "rows": summaries,
    }
    print_table(report)
    if args.json is not None:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"statistics: {args.json}")
    return report


def cli_main() -> None:
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stderr
    )
    run_cli(main, get_parser())


if __name__ == "__main__":
    cli_main()
