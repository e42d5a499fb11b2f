"""Pretraining text for a small RoBERTa: SQuAD paragraphs (a slice of the articles) and plain text files, written as
GPT-2 BPE ids, one paragraph or line per line, ready for ``fairseq-preprocess --only-source --srcdict dict.txt``.

    python examples/qa/mlm_text.py --squad dev-v1.1.json --articles 0:40 \\
        --text wikitext-2/valid.txt --encoder-json encoder.json --vocab-bpe vocab.bpe --output train.bpe

Only the articles named by ``--articles`` are read, so that a masked-LM model pretrained on the training articles of
a split never sees the text of its held-out articles (whose questions it is scored on later).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from fairseq_clusterformer.atomic_files import atomic_open
from fairseq_clusterformer.qa.formats.squad import load_articles
from fairseq_clusterformer.scripts.cli_logging import run_cli


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qa_mlm_text", description=__doc__.split("\n")[0])
    parser.add_argument("--squad", help="a SQuAD-format JSON file whose paragraphs are pretraining text")
    parser.add_argument("--articles", default=":", metavar="START:END", help="only these articles of --squad")
    parser.add_argument(
        "--text", action="append", default=[], help="a plain text file, one paragraph a line (repeatable)"
    )
    parser.add_argument("--encoder-json", required=True, help="GPT-2 encoder.json (local file)")
    parser.add_argument("--vocab-bpe", required=True, help="GPT-2 vocab.bpe (local file)")
    parser.add_argument("--output", required=True, help="file of space-separated BPE ids to write")
    return parser


def squad_paragraphs(path: str, articles: str) -> Iterator[str]:
    data, chosen = load_articles(path, articles)
    for a in chosen:
        for paragraph in data[a].get("paragraphs") or []:
            text = paragraph.get("context") if isinstance(paragraph, dict) else None
            if isinstance(text, str) and text.strip():
                yield text.strip()


def text_lines(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield line.strip()


def main(args: argparse.Namespace) -> tuple[int, int]:
    """Writes args.output; returns (lines, BPE tokens) written."""
    if not args.squad and not args.text:
        raise ValueError("nothing to read: give --squad and/or --text")
    for flag, path in (("--squad", args.squad), *(("--text", t) for t in args.text)):
        if path and not os.path.isfile(path):
            raise FileNotFoundError(f"{flag}: no such file {path}")
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    bpe = get_encoder(args.encoder_json, args.vocab_bpe)
    sources = [squad_paragraphs(args.squad, args.articles)] if args.squad else []
    sources += [text_lines(t) for t in args.text]
    lines = tokens = 0
    with atomic_open(args.output) as out:
        for source in sources:
            for text in source:
                ids = bpe.encode(text)
                out.write(" ".join(map(str, ids)) + "\n")
                lines += 1
                tokens += len(ids)
    print(f"| {args.output}: {lines} lines, {tokens} BPE tokens", file=sys.stderr)
    return lines, tokens


def cli_main() -> None:
    run_cli(main, get_parser())


if __name__ == "__main__":
    cli_main()
