"""fairseq-clusterformer-train-spm: train a sentencepiece model on the text of QA JSONL records.

    fairseq-clusterformer-train-spm --input train.jsonl --model-prefix spm/qa --vocab-size 8000

The model is trained to be lossless, which the QA binariser needs to map answer spans to tokens exactly: identity
normalisation (no NFKC), no dummy prefix and no whitespace squeezing, and byte fallback for unseen characters.
Writes PREFIX.model and PREFIX.vocab; give PREFIX.model to ``fairseq-clusterformer-qa-binarize --tokenizer
sentencepiece --sentencepiece-model``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from fairseq_clusterformer.qa.data.records import SkipLog, read_records


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairseq-clusterformer-train-spm", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--input", nargs="+", required=True, help="QA JSONL files (from fairseq-clusterformer-qa-convert)"
    )
    parser.add_argument("--model-prefix", required=True, help="writes PREFIX.model and PREFIX.vocab")
    parser.add_argument("--vocab-size", type=int, default=16000)
    parser.add_argument("--model-type", choices=["unigram", "bpe"], default="unigram")
    parser.add_argument("--character-coverage", type=float, default=0.9995)
    parser.add_argument("--input-sentence-size", type=int, default=2_000_000, help="lines sampled for training")
    parser.add_argument("--seed", type=int, default=1)
    return parser


def write_training_text(paths: list[str], out) -> int:
    """Questions and every distinct paragraph, one line each (sentencepiece reads lines). Returns the line count."""
    seen, lines = set(), 0
    log = SkipLog()
    for path in paths:
        for _, record in read_records(path, log):
            for text in (record.question, *record.paragraphs):
                for line in text.splitlines():
                    if line.strip() and line not in seen:
                        seen.add(line)
                        out.write(line + "\n")
                        lines += 1
    return lines


def main(args: argparse.Namespace) -> None:
    import sentencepiece as spm

    for path in args.input:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--input: no such file {path}")
    os.makedirs(os.path.dirname(os.path.abspath(args.model_prefix)), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        with open(text, "w", encoding="utf-8") as f:
            lines = write_training_text(args.input, f)
        if lines == 0:
            raise ValueError(f"--input: no text in {', '.join(args.input)}")
        # train into the temporary directory, then move: a failed run leaves no half-written model behind
        prefix = os.path.join(tmp, "model")
        spm.set_random_generator_seed(args.seed)
        spm.SentencePieceTrainer.train(
            input=text,
            model_prefix=prefix,
            vocab_size=args.vocab_size,
            model_type=args.model_type,
            character_coverage=args.character_coverage,
            input_sentence_size=args.input_sentence_size,
            shuffle_input_sentence=True,
            seed_sentencepiece_size=1_000_000,
            normalization_rule_name="identity",
            add_dummy_prefix=False,
            remove_extra_whitespaces=False,
            byte_fallback=True,
            max_sentence_length=1 << 16,
            unk_id=0,
            bos_id=-1,
            eos_id=-1,
            pad_id=-1,
            hard_vocab_limit=False,
            num_threads=1,
            minloglevel=2,
        )
        for ext in ("model", "vocab"):
            os.replace(f"{prefix}.{ext}", f"{args.model_prefix}.{ext}")
    print(f"| trained on {lines} lines of {', '.join(args.input)} -> {args.model_prefix}.model", file=sys.stderr)


def cli_main() -> None:
    args = get_parser().parse_args()
    try:
        main(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"fairseq-clusterformer-train-spm: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli_main()
