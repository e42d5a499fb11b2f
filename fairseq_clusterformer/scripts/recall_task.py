"""A synthetic long-range language modelling task: key-value facts recalled far beyond the sliding windows' reach.

    fairseq-clusterformer-recall-task --out recall-text --length 511 --min-distance 150 --max-distance 450

Every document is one line of ``--length`` words: filler words drawn uniformly from ``--fillers`` words, into which
``--facts`` facts are written. A fact is a key word followed by a value word (``k17 v3``); the keys of a document are
distinct, the values random, so the pair cannot be learnt across documents. Every fact is written a second time,
the same key and value, ``--min-distance`` to ``--max-distance`` words after the first. The recalled value can only be
predicted from the first occurrence, which a sliding-window stack of reach below ``--min-distance`` cannot see:
a full-attention model can bring its loss on those values from log(values) towards 0, a windowed model cannot.
Filler words are uniform, so their loss is log(fillers) for every model, and with few of them (16 by default) they
recur within a few dozen words, which keeps them out of the long-range breakdown's ``beyond reach`` bucket.

Writes ``train.txt``, ``valid.txt``, ``test.txt`` and, for each, ``<split>.facts.jsonl``: per document the positions
(0-based word index in the line) of every fact's first key and of its recall, and their distance.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TaskShape:
    length: int = 511  # words per document: with its end-of-line token, one 512-token sample
    facts: int = 8
    keys: int = 128
    values: int = 64
    fillers: int = 16
    min_distance: int = 150
    max_distance: int = 450

    def check(self) -> None:
        """Refuse, naming the flag, shapes that cannot be laid out."""
        if self.facts < 1 or self.facts > self.keys:
            raise ValueError(f"--facts must be in 1..--keys ({self.keys}): keys are distinct in a document")
        if min(self.values, self.fillers) < 1:
            raise ValueError("--values and --fillers must be >= 1")
        if not 2 <= self.min_distance <= self.max_distance:
            raise ValueError(
                f"need 2 <= --min-distance <= --max-distance, got {self.min_distance}, {self.max_distance}"
            )
        if self.min_distance + 2 > self.length:
            raise ValueError(f"--length {self.length}: no room for a recall --min-distance {self.min_distance} on")
        if 4 * self.facts > self.length - self.min_distance:
            raise ValueError(f"--facts {self.facts}: too many for --length {self.length} at that --min-distance")


def lay_out(shape: TaskShape, rng: random.Random) -> list[tuple[int, int]]:
    """(first, recall) word positions of every fact, each pair of words free of the others."""
    taken: set[int] = set()
    pairs = []
    for _ in range(1000 * shape.facts):
        if len(pairs) == shape.facts:
            break
        first = rng.randrange(0, shape.length - shape.min_distance - 1)
        distance = rng.randint(shape.min_distance, min(shape.max_distance, shape.length - 2 - first))
        recall = first + distance
        slots = {first, first + 1, recall, recall + 1}
        if slots & taken:
            continue  # overlaps an earlier fact: draw again (the checks above leave plenty of room)
        taken |= slots
        pairs.append((first, recall))
    if len(pairs) < shape.facts:
        raise ValueError(f"--facts {shape.facts}: no room for that many in --length {shape.length}")
    return sorted(pairs)


def document(shape: TaskShape, rng: random.Random) -> tuple[list[str], list[dict]]:
    words = [f"w{rng.randrange(shape.fillers)}" for _ in range(shape.length)]
    facts = []
    for (first, recall), key in zip(lay_out(shape, rng), rng.sample(range(shape.keys), shape.facts)):
        value = rng.randrange(shape.values)
        words[first], words[first + 1] = f"k{key}", f"v{value}"
        words[recall], words[recall + 1] = f"k{key}", f"v{value}"
        facts.append({"key": key, "value": value, "first": first, "recall": recall, "distance": recall - first})
    return words, facts


def write_split(out: Path, split: str, count: int, shape: TaskShape, rng: random.Random) -> None:
    with (out / f"{split}.txt").open("w") as text, (out / f"{split}.facts.jsonl").open("w") as facts:
        for _ in range(count):
            words, placed = document(shape, rng)
            text.write(" ".join(words) + "\n")
            facts.write(json.dumps(placed) + "\n")


def main(argv: list[str] | None = None) -> None:
    defaults = TaskShape()
    parser = argparse.ArgumentParser(prog="fairseq-clusterformer-recall-task", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the text files (created)")
    parser.add_argument("--train-docs", type=int, default=4000)
    parser.add_argument("--valid-docs", type=int, default=100)
    parser.add_argument("--test-docs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    for field, value in vars(defaults).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=value)
    args = parser.parse_args(argv)
    shape = TaskShape(**{field: getattr(args, field) for field in vars(defaults)})
    try:
        shape.check()
    except ValueError as error:
        parser.error(str(error))
    for flag in ("train_docs", "valid_docs", "test_docs"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    for split in ("train", "valid", "test"):
        write_split(args.out, split, getattr(args, f"{split}_docs"), shape, rng)
    print(f"wrote {args.out}/{{train,valid,test}}.txt with {shape}")


def cli_main() -> None:
    main()


if __name__ == "__main__":
    cli_main()
