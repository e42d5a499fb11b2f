"""What scoring a QA run on whole articles costs on this machine: fairseq-clusterformer-qa-predict's forward pass and
answer decoding on one batch of the first questions of every article of a split, per article, extrapolated to every
question of the split (the prediction script batches the questions by length, so a batch holds one article's).

    OMP_NUM_THREADS=1 python -m benchmarks.qa_scoring_cost DATA_BIN --path CHECKPOINT [--per-article 8] \
        [--batch-size 8] [--autocast-bf16] [--json cost.json]

The model is loaded as qa-predict loads it, on the CPU; one untimed pass over a single question warms the allocator
up first. Threads: torch's (OMP_NUM_THREADS). Wall seconds and this process's CPU seconds (its threads together)
are printed, with the load average: on a shared machine the other processes' work lengthens the wall time, less
so the CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

import torch

from benchmarks.common import stopwatch
from fairseq_clusterformer.qa.scripts.predict import load


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", help="binarised QA directory (whole-article contexts)")
    parser.add_argument("--path", required=True, help="clusterformer_qa checkpoint")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--per-article", type=int, default=8, help="questions timed per article")
    parser.add_argument("--batch-size", type=int, default=8, help="questions per forward pass (qa-predict's flag)")
    parser.add_argument("--autocast-bf16", action="store_true", help="layers in bfloat16 (qa-predict's flag)")
    parser.add_argument("--json", help="also write the figures here")
    return parser


@torch.no_grad()
def seconds_per_question(model, task, dataset, indices: list[int], batch_size: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process's threads together) a question."""
    with stopwatch() as took:
        for first in range(0, len(indices), batch_size):
            sample = dataset.collater([dataset[i] for i in indices[first : first + batch_size]])
            task.decode_answers(model(**sample["net_input"]), sample["net_input"]["context"])
    return took.wall / len(indices), took.cpu / len(indices)


def main(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    loaded = argparse.Namespace(
        data=args.data, path=args.path, max_context_eval=None, max_answer_tokens=None, cpu=True,
        autocast_bf16=args.autocast_bf16,
    )  # fmt: skip
    model, task = load(loaded)
    task.load_dataset(args.split)
    dataset, data = task.dataset(args.split), task.split_data(args.split)
    articles: dict[str, list[int]] = defaultdict(list)  # title -> dataset indices, in the split's order
    for i, item in enumerate(dataset.items):
        articles[data.metas[item.index]["extra"]["title"]].append(i)
    first = next(iter(articles.values()))
    seconds_per_question(model, task, dataset, first[:1], 1)  # warm-up, not timed
    rows, total, total_cpu = [], 0.0, 0.0
    for title, indices in articles.items():
        timed = indices[: args.per_article]
        wall, cpu = seconds_per_question(model, task, dataset, timed, args.batch_size)
        tokens = int(dataset.sizes[timed[0]])
        load_now = os.getloadavg()[0]
        rows.append({"article": title, "questions": len(indices), "timed": len(timed), "tokens": tokens,
                     "s_per_question": wall, "cpu_s_per_question": cpu, "load_average": load_now})  # fmt: skip
        total, total_cpu = total + wall * len(indices), total_cpu + cpu * len(indices)
        print(f"| {title:<30} {len(indices):>4} questions {tokens:>6} tokens {wall:6.2f} s a question "
              f"({cpu:6.2f} CPU s) load {load_now:.1f}", flush=True)  # fmt: skip
    questions = sum(r["questions"] for r in rows)
    report = {
        "checkpoint": args.path,
        "threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "questions": questions,
        "extrapolated_s": total,
        "extrapolated_cpu_s": total_cpu,
        "s_per_question": total / questions,
        "load_average_before_after": [load_before, os.getloadavg()[0]],
        "articles": rows,
    }
    print(
        f"| {questions} questions on {report['threads']} thread(s): {total:.0f} s ({total / 60:.1f} min, "
        f"{total / questions:.2f} s a question; {total_cpu / 60:.1f} CPU minutes); load average {load_before:.1f} "
        f"before, {os.getloadavg()[0]:.1f} after"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main(get_parser().parse_args())
