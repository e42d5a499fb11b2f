"""Trivial extractive-QA baselines, scored with the official SQuAD v1.1 EM / F1 on the questions of a QA JSONL split,
and (optionally) the prediction files of trained models on the same questions, in one table.

    python -m benchmarks.qa_report.baselines --train train.jsonl --eval valid.jsonl --seed 1 \\
        [--predictions NAME=valid.pred.json ...] [--json summary.json]

Spans are counted in whitespace-separated words of the context (its paragraphs joined by a space), so the baselines
do not depend on a tokeniser:
- ``first_span``: the first n words of the context, n the median length in words of the first gold answer of the
  training questions (the length a guesser that knows nothing of the question would pick);
- ``random_span``: a start drawn uniformly over the context's words and a length drawn from the training questions'
  answer lengths (seeded by ``--seed``; a length longer than the context is cut to the context).
A question without a prediction scores 0, as in the official script.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
from collections.abc import Sequence

from fairseq_clusterformer.qa.data.records import QARecord, SkipLog, read_records
from fairseq_clusterformer.qa.ops.metrics import squad_scores
from fairseq_clusterformer.scripts.cli_logging import run_cli


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qa_baselines", description=__doc__.split("\n")[0])
    parser.add_argument("--train", required=True, help="QA JSONL records whose gold answers give the span lengths")
    parser.add_argument("--eval", required=True, help="QA JSONL records to answer and score")
    parser.add_argument("--seed", type=int, default=1, help="random_span's seed")
    parser.add_argument(
        "--predictions",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="a model's official prediction file ({id: answer}) to score beside the baselines",
    )
    parser.add_argument(
        "--first-words",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="also score the first N words of each context (repeatable): a length-matched first_span for a model "
        "whose answers are longer than the gold ones, since token F1 rewards long spans",
    )
    parser.add_argument("--json", help="write the table here as JSON")
    return parser


def read(path: str, flag: str) -> list[QARecord]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{flag} {path}: no such file")
    records = [record for _, record in read_records(path, SkipLog())]
    if not records:
        raise ValueError(f"{flag} {path}: no usable QA record")
    return records


def answer_lengths(records: Sequence[QARecord]) -> list[int]:
    """Length in words of each record's first gold answer (records without one are left out)."""
    return [len(r.answers[0].split()) for r in records if r.answers and r.answers[0].split()]


def first_span(context: str, length: int) -> str:
    return " ".join(context.split()[:length])


def random_span(context: str, lengths: Sequence[int], rng: random.Random) -> str:
    words = context.split()
    length = min(rng.choice(lengths), len(words))
    start = rng.randrange(len(words) - length + 1)
    return " ".join(words[start : start + length])


def baselines(train: Sequence[QARecord], eval_records: Sequence[QARecord], seed: int) -> dict[str, dict]:
    """{name: {"exact_match", "f1", "questions", ...}} of the two baselines on ``eval_records``."""
    lengths = answer_lengths(train)
    if not lengths:
        raise ValueError("--train: no record has a gold answer to take a length from")
    median = int(statistics.median_low(lengths))
    rng = random.Random(seed)
    golds = {r.id: r.answers for r in eval_records}
    first = {r.id: first_span(" ".join(r.paragraphs), median) for r in eval_records}
    rand = {r.id: random_span(" ".join(r.paragraphs), lengths, rng) for r in eval_records}
    return {
        "first_span": {**squad_scores(golds, first), "questions": len(golds), "words": median},
        "random_span": {**squad_scores(golds, rand), "questions": len(golds), "seed": seed},
    }


def score_predictions(eval_records: Sequence[QARecord], spec: str) -> tuple[str, dict]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--predictions {spec!r}: expected NAME=FILE")
    try:
        with open(path, encoding="utf-8") as f:
            predictions = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--predictions {spec!r}: cannot read a JSON prediction file ({e})") from e
    if not isinstance(predictions, dict):
        raise ValueError(f"--predictions {spec!r}: expected a JSON object {{question id: answer}}")
    golds = {r.id: r.answers for r in eval_records}
    answered = sum(qid in predictions for qid in golds)
    return name, {**squad_scores(golds, predictions), "questions": len(golds), "answered": answered}


def main(args: argparse.Namespace) -> dict[str, dict]:
    train, eval_records = read(args.train, "--train"), read(args.eval, "--eval")
    table = baselines(train, eval_records, args.seed)
    golds = {r.id: r.answers for r in eval_records}
    for n in args.first_words:
        if n < 1:
            raise ValueError(f"--first-words {n}: expected a positive number of words")
        first = {r.id: first_span(" ".join(r.paragraphs), n) for r in eval_records}
        table[f"first_{n}_words"] = {**squad_scores(golds, first), "questions": len(golds), "words": n}
    for spec in args.predictions:
        name, row = score_predictions(eval_records, spec)
        table[name] = row
    for name, row in table.items():
        print(f"| {name}: EM {row['exact_match']:.2f} | F1 {row['f1']:.2f} | {row['questions']} questions")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=1)
    return table


def cli_main() -> None:
    run_cli(main, get_parser())


if __name__ == "__main__":
    cli_main()
