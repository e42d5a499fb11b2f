"""fairseq-clusterformer-qa-binarize: QA JSONL records -> fairseq indexed datasets for the clusterformer_qa task.

    fairseq-clusterformer-qa-binarize --tokenizer gpt2 --encoder-json encoder.json --vocab-bpe vocab.bpe \
        --dict dict.txt --train train.jsonl --valid valid.jsonl --destdir data-bin/squad
    fairseq-clusterformer-qa-binarize --tokenizer hf --hf-dir IMPORTED --train train.jsonl --destdir ...

--tokenizer hf tokenises as a Hugging Face encoder imported with fairseq-clusterformer-import-hf does (IMPORTED holds
its tokenizer.json, dict.txt and hf_import.json); that tokeniser need not be lossless (uncased WordPiece), so no
split is cut, gold spans are the tokens covering the answers, and the contexts' text and token offsets are stored
for the answers to be cut out of the original text.

Bad records (malformed, empty context, answer offsets that do not match the text, questions over
--max-question-tokens) are skipped with a message naming the file, line and id; answers beyond
--max-context-tokens are dropped and counted. The counts per reason are printed at the end and stored in
qa_config.json, and so are the skipped examples of an evaluation split (their ids and NQ gold annotations, with
those the converter skipped), for the prediction script to answer them with a null answer. Only training splits
(named train or train*) are tokenised with a cut at every gold answer edge, so that their gold token spans are
exactly the answers; the contexts of every other split are tokenised as if there were no answer (a cut would mark
the answer in the input), and their gold spans are the tokens covering the answers.
Every output file is written under a temporary name and renamed once every split is complete: a split
that fails leaves --destdir as it was.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from fairseq.data import Dictionary

from fairseq_clusterformer.atomic_files import AtomicFiles, atomic_group
from fairseq_clusterformer.qa.data.binarized import CONFIG, QABinarizedWriter, load_config, save_config
from fairseq_clusterformer.qa.data.encode import MAX_QUESTION_TOKENS, RecordEncoder
from fairseq_clusterformer.qa.data.hf_tokenizer import HFTokenizer, hf_dictionary
from fairseq_clusterformer.qa.data.records import SkipLog, find_occurrences, read_records, skipped_example
from fairseq_clusterformer.qa.data.tokenizers import (
    PARAGRAPH_TOKEN,
    TOKENIZERS,
    GPT2BPETokenizer,
    SentencePieceTokenizer,
    add_paragraph_token,
    sentencepiece_dictionary,
)
from fairseq_clusterformer.scripts.cli_logging import run_cli


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairseq-clusterformer-qa-binarize", description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default="gpt2")
    parser.add_argument("--encoder-json", help="GPT-2 encoder.json (local file; --tokenizer gpt2)")
    parser.add_argument("--vocab-bpe", help="GPT-2 vocab.bpe (local file; --tokenizer gpt2)")
    parser.add_argument("--dict", help="fairseq's GPT-2 dict.txt (--tokenizer gpt2)")
    parser.add_argument("--sentencepiece-model", help="model from fairseq-clusterformer-train-spm")
    parser.add_argument(
        "--hf-dir", help="directory written by fairseq-clusterformer-import-hf (--tokenizer hf; its dict.txt is used)"
    )
    for split in ("train", "valid", "test"):
        parser.add_argument(f"--{split}", metavar="JSONL", help=f"QA records of the {split} split")
    parser.add_argument("--split", action="append", default=[], metavar="NAME=JSONL", help="another split")
    parser.add_argument("--destdir", required=True)
    parser.add_argument("--max-context-tokens", type=int, default=10000, help="longer contexts keep what fits")
    parser.add_argument(
        "--max-question-tokens",
        type=int,
        default=MAX_QUESTION_TOKENS,
        help="longer questions are skipped (the task's --max-question-tokens has the same default)",
    )
    parser.add_argument(
        "--find-all-occurrences",
        action="store_true",
        help="distant supervision: add every whole-word, case-insensitive occurrence of the answers to the spans",
    )
    parser.add_argument(
        "--drop-unreachable",
        action="store_true",
        help="skip examples whose gold answer is not in the (truncated) context, e.g. for a training split",
    )
    return parser


def _splits(args: argparse.Namespace) -> dict[str, str]:
    splits = {s: getattr(args, s) for s in ("train", "valid", "test") if getattr(args, s)}
    for item in args.split:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--split {item!r}: expected NAME=JSONL")
        splits[name] = path
    if not splits:
        raise ValueError("give at least one of --train, --valid, --test or --split NAME=JSONL")
    for name, path in splits.items():
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--{name if name in ('train', 'valid', 'test') else 'split'}: no such file {path}")
    return splits


def _tokenizer(args: argparse.Namespace):
    """Tokeniser and dictionary; a dict.txt already in --destdir (from an earlier split) is reused as is."""
    existing = os.path.join(args.destdir, "dict.txt")
    if args.tokenizer == "gpt2":
        for flag in ("encoder_json", "vocab_bpe", "dict"):
            if not getattr(args, flag):
                raise ValueError(f"--tokenizer gpt2 needs --{flag.replace('_', '-')}")
        if not os.path.isfile(args.dict):
            raise FileNotFoundError(f"--dict: no such file {args.dict}")
        dictionary = Dictionary.load(existing if os.path.isfile(existing) else args.dict)
        add_paragraph_token(dictionary)
        return GPT2BPETokenizer(args.encoder_json, args.vocab_bpe, dictionary), dictionary
    if args.tokenizer == "hf":
        if not args.hf_dir:
            raise ValueError("--tokenizer hf needs --hf-dir (a directory written by fairseq-clusterformer-import-hf)")
        dictionary = Dictionary.load(existing) if os.path.isfile(existing) else hf_dictionary(args.hf_dir)
        add_paragraph_token(dictionary)
        return HFTokenizer(args.hf_dir, dictionary), dictionary
    if not args.sentencepiece_model:
        raise ValueError("--tokenizer sentencepiece needs --sentencepiece-model")
    if not os.path.isfile(args.sentencepiece_model):
        raise FileNotFoundError(f"--sentencepiece-model: no such file {args.sentencepiece_model}")
    dictionary = (
        Dictionary.load(existing) if os.path.isfile(existing) else sentencepiece_dictionary(args.sentencepiece_model)
    )
    add_paragraph_token(dictionary)
    return SentencePieceTokenizer(args.sentencepiece_model, dictionary), dictionary


def is_training_split(name: str) -> bool:
    """Whether split ``name`` is trained on ("train", or a shard or variant such as "train1", "train_nq")."""
    return name.startswith("train")


def binarize_split(
    args, name: str, path: str, encoder: RecordEncoder, dictionary: Dictionary, files: AtomicFiles
) -> dict:
    """Write split ``name`` through ``files`` (renamed into place by the caller) and return its summary."""
    log = SkipLog()
    training = is_training_split(name)
    cut = training and encoder.paragraphs.lossless  # a tokeniser that is not lossless is never cut
    unreachable = 0
    writer = QABinarizedWriter(args.destdir, name, len(dictionary), files)
    for where, record in read_records(path, log):
        if args.find_all_occurrences:
            found = {tuple(s) for s in find_occurrences(record.paragraphs, record.answers)}
            record = dataclasses.replace(record, spans=[list(s) for s in sorted(found | set(map(tuple, record.spans)))])
        example = encoder.encode(record, where, log, cut_at_answers=cut)
        if example is None:
            continue
        if not example.meta["gold_in_context"]:
            if args.drop_unreachable:
                reason = "answer_not_in_context"
                log.skip(
                    where,
                    reason,
                    "no gold answer lies in the kept context",
                    skipped_example(record.id, reason, record.extra),
                )
                continue
            unreachable += 1
        writer.add(example)
    writer.close()
    if writer.count == 0:
        raise ValueError(f"{path}: no usable example (see the messages above); nothing written to {args.destdir}")
    print(
        f"| {name}: {path} -> {os.path.join(args.destdir, name)}.*: {log.summary(writer.count)}; "
        f"{unreachable} kept with their gold answer outside the context",
        file=sys.stderr,
    )
    summary = {
        "source": os.path.abspath(path),
        "examples": writer.count,
        "cut_at_answers": cut,
        "gold_not_in_context": unreachable,
        "skipped": dict(sorted(log.skipped.items())),
        "answers_lost": dict(sorted(log.lost.items())),
        "first_skipped": {reason: log.first[reason] for reason in sorted(log.skipped)},
    }
    if not training:
        # an evaluation split's prediction file must name every example (nq_eval.py rejects one that misses an id):
        # the prediction script writes a null answer for each of these. Not kept for a training split, where
        # --drop-unreachable may skip a large share and nothing is predicted.
        summary["skipped_examples"] = log.skipped_examples
    return summary


def main(args: argparse.Namespace) -> None:
    splits = _splits(args)
    tokenizer, dictionary = _tokenizer(args)
    config_path = os.path.join(args.destdir, CONFIG)
    config = load_config(args.destdir) if os.path.isfile(config_path) else {}
    if config and config.get("tokenizer") != args.tokenizer:
        raise ValueError(f"{config_path} was written with --tokenizer {config.get('tokenizer')}; use another --destdir")
    config.update(tokenizer.config())
    config.update(
        paragraph_token=PARAGRAPH_TOKEN,
        max_context_tokens=args.max_context_tokens,
        max_question_tokens=args.max_question_tokens,
    )
    config.setdefault("splits", {})
    encoder = RecordEncoder(
        tokenizer, dictionary.index(PARAGRAPH_TOKEN), args.max_context_tokens, args.max_question_tokens
    )
    # one group for every file: a split that fails leaves --destdir as it was (no dict.txt, no earlier split)
    with atomic_group() as files:
        with open(files.path(os.path.join(args.destdir, "dict.txt")), "w", encoding="utf-8") as f:
            dictionary.save(f)
        for name, path in splits.items():
            config["splits"][name] = binarize_split(args, name, path, encoder, dictionary, files)
    save_config(args.destdir, config)


def cli_main() -> None:
    run_cli(main, get_parser())


if __name__ == "__main__":
    cli_main()
