"""What the QA ablation benchmarks share (qa_gate_ablation.py, qa_cluster_ablation.py): load a checkpoint as
qa-predict loads it, answer the split's first N questions in several passes that change one thing in the model, and
compare each pass with the first, question by question, with a bootstrap interval over the questions.

Every pass answers the same questions in the same order and batches (consecutive questions share an article, so a
batch pads little), decoded as qa-predict decodes them, so a pass of the unchanged model gives qa-predict's answers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import stopwatch
from benchmarks.machine import cpu_model
from benchmarks.qa_report.paired_bootstrap import bootstrap_interval
from benchmarks.qa_report.table import METRICS, per_question
from fairseq_clusterformer.qa.scripts.predict import load


def add_common_args(parser: argparse.ArgumentParser, path_help: str) -> None:
    parser.add_argument("data", help="directory written by fairseq-clusterformer-qa-binarize")
    parser.add_argument("--path", required=True, help=path_help)
    parser.add_argument("--split", default="valid")
    parser.add_argument("--max-examples", type=int, default=300, help="the split's first N kept questions")
    parser.add_argument("--batch-size", type=int, default=8, help="questions per forward pass")
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--json", type=Path, help="write the figures and every pass's answers here")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    parser.add_argument("--autocast-bf16", action="store_true", help="score as qa-predict --autocast-bf16 does")


def check_common_args(args: argparse.Namespace) -> None:
    if args.max_examples < 1:
        raise SystemExit(f"--max-examples must be at least 1, got {args.max_examples}")
    if args.batch_size < 1:
        raise SystemExit(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.json is not None and not args.json.parent.is_dir():
        raise SystemExit(f"--json {args.json}: its folder does not exist")


def load_model(args: argparse.Namespace):
    """(model, task) as qa-predict loads them, with the split loaded."""
    predict_args = argparse.Namespace(data=args.data, path=args.path, max_context_eval=None, max_answer_tokens=None,
                                      cpu=args.cpu, autocast_bf16=args.autocast_bf16)  # fmt: skip
    model, task = load(predict_args)
    task.load_dataset(args.split)
    return model, task


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


def run_passes(
    model, task, args: argparse.Namespace, passes: dict[str, Callable[[], None]], about: dict | None = None
) -> dict:
    """Answer the first ``args.max_examples`` questions once per pass, in order; each pass's function first sets the
    model up for it. The report holds, per metric, each pass's mean and its per-question difference from the first
    pass (mean and 95 % bootstrap interval), how many answers each pass changed, and ``about``."""
    count = min(args.max_examples, len(task.dataset(args.split)))
    metas = task.split_data(args.split).metas
    gold = {metas[i]["id"]: metas[i]["answers"] for i in range(count)}
    answers, seconds = {}, {}
    for label, prepare in passes.items():
        prepare()
        with stopwatch() as took:
            answers[label] = answer(model, task, args.split, count, args.batch_size)
        seconds[label] = round(took.cpu, 1)
        print(f"| {label}: {count} questions, {seconds[label]} CPU s", flush=True)
    first, *others = passes
    scores = {label: per_question(answers[label], gold) for label in passes}
    report = {"path": str(args.path), "split": args.split, "questions": count, "cpu": cpu_model(),
              "autocast_bf16": args.autocast_bf16, "cpu_seconds": seconds, "reference": first,
              "answers_changed": {label: sum(answers[label][q] != answers[first][q] for q in gold) for label in others},
              **(about or {})}  # fmt: skip
    for name in METRICS:
        report[name] = {label: {"mean": float(scores[label][name].mean())} for label in passes}
        for label in others:
            diff = scores[label][name] - scores[first][name]  # Q: this pass minus the first
            interval = bootstrap_interval(diff, args.resamples, seed=1)
            report[name][label].update(difference=float(diff.mean()), interval=interval)
            print(f"| {name}: {first} {report[name][first]['mean']:.2f}, {label} {report[name][label]['mean']:.2f}, "
                  f"difference {diff.mean():+.2f} [{interval[0]:+.2f}, {interval[1]:+.2f}]")  # fmt: skip
    for label in others:
        print(f"| answers changed by {label}: {report['answers_changed'][label]} of {count}")
    if args.json is not None:
        report["answers"] = answers
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report
