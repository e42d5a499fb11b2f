"""How much of a hybrid QA checkpoint's answers its far attention decides: the same checkpoint scored with its
long-range gates as trained and with every gate set to 0 (the hybrid layers then compute exactly their pretrained
sliding-window attention), on the split's first --max-examples questions.

    python benchmarks/qa_gate_ablation.py data-bin/qa/reduced/squad_article/bin \
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
import time
from pathlib import Path

import torch
from bench_common import cpu_model

from fairseq_clusterformer.qa.ops.paired_bootstrap import bootstrap_interval
from fairseq_clusterformer.qa.scripts.predict import load
from fairseq_clusterformer.qa.scripts.table import METRICS, per_question


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", help="directory written by fairseq-clusterformer-qa-binarize")
    parser.add_argument("--path", required=True, help="clusterformer_qa checkpoint with hybrid long-range layers")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--max-examples", type=int, default=300, help="the split's first N kept questions")
    parser.add_argument("--batch-size", type=int, default=8, help="questions per forward pass")
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--json", type=Path, help="write the figures and both passes' answers here")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    parser.add_argument("--autocast-bf16", action="store_true", help="score as qa-predict --autocast-bf16 does")
    return parser


@torch.no_grad()
def answer(model, task, split: str, count: int, batch_size: int) -> dict[str, str]:
    """Question id -> answer text for the split's first ``count`` kept questions, decoded as qa-predict decodes."""
    dataset, metas = task.dataset(split), task.split_data(split).metas
    device = next(model.parameters()).device
    answers = {}
    for first in range(0, count, batch_size):
        sample = dataset.collater([dataset[i] for i in range(first, min(first + batch_size, count))])
        net_input = {k: v.to(device) if torch.is_tensor(v) else v for k, v in sample["net_input"].items()}
        logits = model(**net_input)
        for i, pred in zip(sample["example_index"], task.decode_answers(logits, net_input["context"])):
            answers[metas[i]["id"]] = task.answer_text(split, i, pred.start, pred.end)
    return answers


def main(args: argparse.Namespace) -> dict:
    if args.max_examples < 1:
        raise SystemExit(f"--max-examples must be at least 1, got {args.max_examples}")
    if args.json is not None and not args.json.parent.is_dir():
        raise SystemExit(f"--json {args.json}: its folder does not exist")
    predict_args = argparse.Namespace(data=args.data, path=args.path, max_context_eval=None, max_answer_tokens=None,
                                      cpu=args.cpu, autocast_bf16=args.autocast_bf16)  # fmt: skip
    model, task = load(predict_args)
    gates = {name: p for name, p in model.named_parameters() if name.endswith("long_range_gate")}
    if not gates:
        raise SystemExit(f"--path {args.path}: no hybrid long-range layer (trained with --long-range-mode hybrid?)")
    task.load_dataset(args.split)
    count = min(args.max_examples, len(task.dataset(args.split)))
    metas = task.split_data(args.split).metas
    passes, seconds = {}, {}

    def score_pass(label: str) -> None:
        start = time.process_time()
        passes[label] = answer(model, task, args.split, count, args.batch_size)
        seconds[label] = round(time.process_time() - start, 1)
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
