"""fairseq-clusterformer-qa-convert: a QA data set in its published format -> QA JSONL records.

    fairseq-clusterformer-qa-convert --format squad dev-v1.1.json squad-dev.jsonl
    fairseq-clusterformer-qa-convert --format quasart dev_questions.json.gz dev.jsonl --contexts dev_contexts.json.gz
    fairseq-clusterformer-qa-convert --format searchqa val.txt val.jsonl          (or a directory of *.json files)
    fairseq-clusterformer-qa-convert --format nq simplified-nq-train.jsonl.gz nq-train.jsonl

The record format is described in fairseq_clusterformer/qa/data/records.py. Bad records are skipped with a message
naming the file and record, and counted per reason at the end; a converter that must keep the ids of the examples
it skips (NQ, whose official evaluation needs every id) writes a ``SkippedRecord`` line for each. The output is
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from fairseq_clusterformer.atomic_files import atomic_open
from fairseq_clusterformer.qa.data.records import RecordError, SkipLog, SkippedRecord
from fairseq_clusterformer.scripts.cli_logging import run_cli

FORMATS = ("squad", "quasart", "searchqa", "nq")


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairseq-clusterformer-qa-convert", description=__doc__.split("\n")[0])
    parser.add_argument("--format", required=True, choices=FORMATS)
    parser.add_argument("input", help="published file (.gz accepted; SearchQA: also a directory of .json files)")
    parser.add_argument("output", help="QA JSONL file to write")
    parser.add_argument("--contexts", help="Quasar-T: the {split}_contexts.json.gz file matching the questions")
    parser.add_argument(
        "--articles",
        default=":",
        metavar="START:END",
        help="SQuAD: only the articles in this Python slice of the file's articles, e.g. 0:40 and 40: for a split",
    )
    parser.add_argument(
        "--context-unit",
        default="article",
        choices=("article", "paragraph"),
        help="SQuAD: a question's context is its whole article (default, long-context) or its own paragraph",
    )
    parser.add_argument("--limit", type=int, default=0, help="stop after this many records (0: all)")
    return parser


def main(args: argparse.Namespace) -> int:
    if not os.path.exists(args.input):
        raise FileNotFoundError(f"input: no such file or directory {args.input}")
    module = importlib.import_module(f"fairseq_clusterformer.qa.formats.{args.format}")
    log = SkipLog()
    written = 0
    with atomic_open(args.output) as out:
        seen_contexts = set()
        for record in module.convert(args.input, args, log):
            if isinstance(record, SkippedRecord):
                out.write(record.to_json() + "\n")  # already counted in the log; the binariser reads it as skipped
                continue
            try:
                record.validate()
            except RecordError as e:
                log.skip(f"{args.input} [{record.id}]", e.reason, str(e))
                continue
            out.write(record.to_json(with_paragraphs=record.context_id not in seen_contexts) + "\n")
            seen_contexts.add(record.context_id)
            written += 1
            if written == args.limit:
                break
        if written == 0:
            raise ValueError(f"{args.input}: no usable record (see the messages above); {args.output} not written")
    print(f"| {args.format}: {args.input} -> {args.output}: {log.summary(written)}", file=sys.stderr)
    return written


def cli_main() -> None:
    run_cli(main, get_parser())


if __name__ == "__main__":
    cli_main()
