"""A synthetic long-range language modelling task: key-value facts recalled far beyond the sliding windows' reach.

    fairseq-clusterformer-recall-task --out recall-text --length 127 --facts 6 --fillers 256 --filler loop \\
        --loop-min 3 --loop-max 6 --min-distance 40 --max-distance 100

Every document is one line of ``--length`` words: filler words (below) from ``--fillers`` words, into which
``--facts`` facts are written. A fact is a key word followed by a value word (``k17 v3``); the keys of a document are
distinct, the values random, so the pair cannot be learnt across documents. Every fact is written a second time,
the same key and value, ``--min-distance`` to ``--max-distance`` words after the first. The recalled value can only be
predicted from the first occurrence, which a sliding-window stack of reach below ``--min-distance`` cannot see:
a full-attention model can bring its loss on those values from log(values) towards 0, a windowed model cannot.
With ``--copies`` N, N spans of ``--copy-length`` words from their own vocabulary of ``--copy-words`` are also
written twice, verbatim, the same distances apart: once the model finds where a copy began, every later word of it is
predictable from the first span, which gives a long-range signal on many tokens per document.
With ``--value-vocab per-key`` every key has its own values (``k17 v17_3``): the recalled value is then the one word
of its key's vocabulary seen earlier in the document, which attention can find by content in one layer, where a
shared vocabulary needs the two-layer induction circuit (find the earlier key, then read the word after it). On
512-token documents neither form left chance within 2,000 updates of a 4-layer CPU model; on 128-token documents with
looped fillers the shared form is learnt (benchmarks/results/longrange_calibration).
Fillers (``--filler``):
- ``uniform`` (the default): drawn uniformly from ``--fillers`` words, so their loss is log(fillers) for every model.
- ``cycle``: one fixed cycle (``w0 w1 ... w15 w0 ...``) from a random start in each document, carrying on behind a
  fact, so every model soon predicts a filler from the word before and its gradient no longer buries the few recalled
  values in noise.
- ``loop``: every document repeats its own loop of ``--loop-min`` to ``--loop-max`` distinct words drawn from
  ``--fillers``. The next filler is the word that followed the current one a period earlier, so every filler word
  trains the in-context copying (induction) a recall needs, within the windows, where the recalls alone are too rare
  to start it; many fillers (256) make that copying work for any word.
A filler recurs within a loop's period or a few dozen words, which keeps fillers out of the long-range breakdown's
``beyond reach`` bucket.

Writes ``train.txt``, ``valid.txt``, ``test.txt`` and, for each, ``<split>.facts.jsonl``: per document the positions
(0-based word index in the line) where every fact or copy first starts and where its recall starts, and their
distance.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

FILLERS = ("uniform", "cycle", "loop")
VALUE_VOCABS = ("shared", "per-key")
CHOICES = {"filler": FILLERS, "value_vocab": VALUE_VOCABS}


@dataclass(frozen=True)
class TaskShape:
    length: int = 511  # words per document: with its end-of-line token, one 512-token sample
    facts: int = 8
    keys: int = 128
    values: int = 64
    fillers: int = 16
    min_distance: int = 150
    max_distance: int = 450
    copies: int = 0  # spans written twice, verbatim
    copy_length: int = 32
    copy_words: int = 1024  # the spans' own vocabulary: large, so a copied word rarely occurs elsewhere
    filler: str = "uniform"  # or "cycle": the fillers follow a fixed cycle, predictable from the word before
    value_vocab: str = "shared"  # or "per-key": key k's values are v{k}_0 .. v{k}_{values - 1}
    loop_min: int = 8  # --filler loop: each document's loop has loop_min .. loop_max distinct fillers
    loop_max: int = 16

    def check(self) -> None:
        """Refuse, naming the flag, shapes that cannot be laid out."""
        if not 0 <= self.facts <= self.keys:
            raise ValueError(f"--facts must be in 0..--keys ({self.keys}): keys are distinct in a document")
        if self.facts + self.copies < 1 or self.copies < 0:
            raise ValueError("--facts and --copies: need at least one fact or copy, and neither negative")
        for field, allowed in CHOICES.items():
            if getattr(self, field) not in allowed:
                flag = "--" + field.replace("_", "-")
                raise ValueError(f"{flag} must be one of {', '.join(allowed)}, got {getattr(self, field)!r}")
        if self.filler == "loop" and not 2 <= self.loop_min <= self.loop_max <= self.fillers:
            raise ValueError(
                f"--filler loop needs 2 <= --loop-min <= --loop-max <= --fillers, got {self.loop_min}, "
                f"{self.loop_max}, {self.fillers}"
            )
        if min(self.values, self.fillers, self.copy_words, self.copy_length) < 1:
            raise ValueError("--values, --fillers, --copy-words and --copy-length must be >= 1")
        if not 2 <= self.min_distance <= self.max_distance:
            raise ValueError(
                f"need 2 <= --min-distance <= --max-distance, got {self.min_distance}, {self.max_distance}"
            )
        widest = max(2 if self.facts else 1, self.copy_length if self.copies else 1)
        if self.min_distance < widest or self.min_distance + widest > self.length:
            raise ValueError(
                f"--min-distance {self.min_distance}: must be at least a fact's or copy's width ({widest}) and leave"
                f" room for the recall in --length {self.length}"
            )
        used = 4 * self.facts + 2 * self.copies * self.copy_length
        if used > self.length:  # a tighter layout that still fails is caught by lay_out, after its draws
            raise ValueError(f"--facts / --copies: {used} words too many for --length {self.length}")


def lay_out(shape: TaskShape, widths: list[int], rng: random.Random) -> list[tuple[int, int]]:
    """(first, recall) word positions of spans of the given widths, every span and its recall free of the others."""
    taken: set[int] = set()
    pairs: dict[int, tuple[int, int]] = {}
    # the widest first: once narrow spans are scattered over the document a wide one may find no gap left
    for n in sorted(range(len(widths)), key=lambda n: -widths[n]):
        width = widths[n]
        for _ in range(1000):
            first = rng.randrange(0, shape.length - shape.min_distance - width + 1)
            distance = rng.randint(shape.min_distance, min(shape.max_distance, shape.length - width - first))
            recall = first + distance
            slots = set(range(first, first + width)) | set(range(recall, recall + width))
            if not slots & taken:
                break  # else it overlaps an earlier span: draw again (check() leaves plenty of room)
        else:
            raise ValueError(f"--facts / --copies: no room for that many in --length {shape.length}")
        taken |= slots
        pairs[n] = (first, recall)
    return [pairs[n] for n in range(len(widths))]


def document(shape: TaskShape, rng: random.Random) -> tuple[list[str], list[dict]]:
    """One document's words, and for each fact or copy its first and recalled position (word index)."""
    if shape.filler == "cycle":
        start = rng.randrange(shape.fillers)  # the word at position i is w[(start + i) % fillers], facts or not
        words = [f"w{(start + i) % shape.fillers}" for i in range(shape.length)]
    elif shape.filler == "loop":
        # this document's own loop of distinct fillers, of a random period: the next filler is the one that followed
        # the current word a period ago, which only attention (an induction head) can find, on every filler word
        period = rng.randint(shape.loop_min, shape.loop_max)
        loop = rng.sample(range(shape.fillers), period)
        words = [f"w{loop[i % period]}" for i in range(shape.length)]
    else:
        words = [f"w{rng.randrange(shape.fillers)}" for _ in range(shape.length)]
    widths = [2] * shape.facts + [shape.copy_length] * shape.copies
    placed = []
    keys = rng.sample(range(shape.keys), shape.facts)
    for n, ((first, recall), width) in enumerate(zip(lay_out(shape, widths, rng), widths)):
        if n < shape.facts:
            value = rng.randrange(shape.values)
            typed = f"{keys[n]}_" if shape.value_vocab == "per-key" else ""
            span = [f"k{keys[n]}", f"v{typed}{value}"]
            record = {"kind": "fact", "key": keys[n], "value": value}
        else:
            span = [f"c{rng.randrange(shape.copy_words)}" for _ in range(width)]
            record = {"kind": "copy", "length": width}
        words[first : first + width] = span
        words[recall : recall + width] = span
        placed.append({**record, "first": first, "recall": recall, "distance": recall - first})
    return words, sorted(placed, key=lambda r: r["first"])


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
        kind = {"choices": CHOICES[field]} if field in CHOICES else {}
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value, **kind)
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
