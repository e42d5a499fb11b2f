"""How much of a hybrid QA checkpoint's answers its far attention decides: the same checkpoint scored with its
long-range gates as trained and with every gate set to 0 (the hybrid layers then compute exactly their pretrained
sliding-window attention), on the split's first --max-examples questions.

    python -m benchmarks.qa_gate_ablation data-bin/qa/reduced/squad_article/bin \
        --path data-bin/qa/reduced/article_cluster-hybrid-bf16-attdrop0_seed1/checkpoint_last.pt \
        --max-examples 300 --cpu --autocast-bf16 --json gate_ablation.json

If EM / F1 fall when the gates close, the far attention is part of what the model answers with; if they do not, a gain
of the hybrid layers over `none` came from how they trained, not from what they read at scoring time. Both passes run
here, batch by batch over the same questions in the same order (consecutive questions share an article, so a batch
pads little); the difference is per question (gates at 0 minus as trained) with its 95 % percentile bootstrap
interval over the questions. A checkpoint without hybrid layers is refused.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.common import stopwatch
from benchmarks.machine import cpu_model
from benchmarks.qa_ablation_passes import add_common_args, answer, check_common_args, load_model
from benchmarks.qa_report.paired_bootstrap import bootstrap_interval
from benchmarks.qa_report.table import METRICS, per_question


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(parser, "clusterformer_qa checkpoint with hybrid long-range layers")
    return parser


def main(args: argparse.Namespace) -> dict:
    check_common_args(args)
    model, task = load_model(args)
    gates = {name: p for name, p in model.named_parameters() if name.endswith("long_range_gate")}
    if not gates:
        raise SystemExit(f"--path {args.path}: no hybrid long-range layer (trained with --long-range-mode hybrid?)")
    count = min(args.max_examples, len(task.dataset(args.split)))
    metas = task.split_data(args.split).metas
    passes, seconds = {}, {}

    def score_pass(label: str) -> None:
        with stopwatch() as took:
            passes[label] = answer(model, task, args.split, count, args.batch_size)
        seconds[label] = round(took.cpu, 1)
        print(f"| {label}: {count} questions, {seconds[label]} CPU s", flush=True)

    score_pass("as_trained")
    with torch.no_grad():
        for gate in gates.values():
            gate.zero_()
    score_pass("gates_at_0")
    gold = {metas[i]["id"]: metas[i]["answers"] for i in range(count)}
    trained, closed = per_question(passes["as_trained"], gold), per_question(passes["gates_at_0"], gold)
    report = {"path": str(args.path), "questions": count, "cpu": cpu_model(), "autocast_bf16": args.autocast_bf16,
              "cpu_seconds": seconds, "answers_changed": sum(passes["as_trained"][q] != passes["gates_at_0"][q]
                                                            for q in gold)}  # fmt: skip
    for name in METRICS:
        diff = closed[name] - trained[name]  # Q: gates at 0 minus as trained
        report[name] = {"as_trained": float(trained[name].mean()), "gates_at_0": float(closed[name].mean()),
                        "difference": float(diff.mean()),
                        "interval": bootstrap_interval(diff, args.resamples, seed=1)}  # fmt: skip
        low, high = report[name]["interval"]
        print(f"| {name}: as trained {report[name]['as_trained']:.2f}, gates at 0 {report[name]['gates_at_0']:.2f}, "
              f"difference {report[name]['difference']:+.2f} [{low:+.2f}, {high:+.2f}]")  # fmt: skip
    print(f"| answers changed by closing the gates: {report['answers_changed']} of {count}")
    if args.json is not None:
        report["answers"] = passes
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main(get_parser().parse_args())
