"""fairseq-clusterformer-qa-ask: ask a trained clusterformer_qa checkpoint a question about a text file.

    fairseq-clusterformer-qa-ask --path checkpoints/checkpoint_best.pt --question "Who wrote it?" --context doc.txt
    fairseq-clusterformer-qa-ask --path checkpoints/checkpoint_best.pt --jsonl questions.jsonl > answers.jsonl

One question prints its answer, score and character span in the file (``-`` reads the context from standard
input). ``--jsonl`` reads one {"question", "context"} object a line (an "id" is passed through; another field is an
error of that line) and writes one JSON line per input line as soon as its batch is answered: {"line", "answers":
[{"text", "start", "end", "score", ...}]}, or {"line", "error"} for a line that cannot be answered, which is also
named on standard error (the status is then 1, as for a --jsonl that holds no question). ``--top-k`` answers share
no token unless ``--overlapping-answers``; the layers run in float32 unless ``--autocast-bf16``, whatever precision
the checkpoint was trained in. The checkpoint's data folder (dict.txt, qa_config.json) and tokeniser are found as
``ClusterFormerQAModel.from_pretrained`` finds them (``--data`` to name the folder). A context over the model's
--max-context-eval is refused unless ``--context-overflow truncate``; a cut answer says where the reading stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator

from fairseq_clusterformer.qa.data.records import SkipLog, iter_json_lines
from fairseq_clusterformer.qa.hub import OVERFLOW, Answer, EncodedQuestion
from fairseq_clusterformer.qa.hub_loading import NotAQACheckpoint, load_hub
from fairseq_clusterformer.scripts.cli_logging import run_cli

logger = logging.getLogger("fairseq_clusterformer.qa_ask")

LINE_FIELDS = ("question", "context", "id")  # what a --jsonl line may hold ("id" optional)


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairseq-clusterformer-qa-ask", description=__doc__.split("\n")[0])
    parser.add_argument("--path", required=True, help="clusterformer_qa checkpoint")
    parser.add_argument("--data", help="its data folder (dict.txt, qa_config.json; default: found as the hub does)")
    parser.add_argument("--question", help="the question (with --context)")
    parser.add_argument("--context", metavar="FILE", help="UTF-8 text file the answer is taken from; - = stdin")
    parser.add_argument("--jsonl", metavar="FILE", help='one {"question", "context"} object a line; - = stdin')
    parser.add_argument("--top-k", type=int, default=1, help="answers per question, best first, sharing no token")
    parser.add_argument("--overlapping-answers", action="store_true",
                        help="--top-k: the best spans even where they overlap (around the best answer)")  # fmt: skip
    parser.add_argument("--context-overflow", choices=tuple(OVERFLOW), default="refuse",
                        help="a context over --max-context-eval: refuse it, or read its first tokens")  # fmt: skip
    parser.add_argument("--max-context-eval", type=int, help="longest context in tokens (default: the checkpoint's)")
    parser.add_argument("--max-answer-tokens", type=int, help="longest answer span (default: the checkpoint's)")
    parser.add_argument("--batch-size", type=int, default=8, help="--jsonl: questions per forward pass")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    parser.add_argument("--autocast-bf16", action="store_true",
                        help="layers under torch.autocast(bfloat16), as in qa-predict (default: float32)")  # fmt: skip
    return parser


def read_text(path: str, flag: str) -> str:
    """The UTF-8 text of ``path`` (``-``: standard input), characters as they are (no newline translation)."""
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        with open(path, "rb") as f:
            data = f.read()
    name = "standard input" if path == "-" else path
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag} {name}: not UTF-8 text (byte 0x{data[e.start]:02x} at byte {e.start + 1})") from None
    if "\x00" in text:
        raise ValueError(f"{flag} {name}: not a text file (it holds NUL bytes at byte {text.index(chr(0)) + 1})")
    return text


def check_args(args: argparse.Namespace) -> None:
    if args.jsonl is not None and (args.question is not None or args.context is not None):
        raise ValueError("give --jsonl, or --question with --context, not both")
    if args.jsonl is None and (args.question is None or args.context is None):
        raise ValueError("give --question with --context FILE (or --jsonl FILE for many questions)")
    for flag in ("top_k", "batch_size", "max_context_eval", "max_answer_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    for flag, path in (("--path", args.path), ("--context", args.context), ("--jsonl", args.jsonl)):
        if path not in (None, "-") and not os.path.isfile(path):
            raise FileNotFoundError(f"{flag} {path}: no such file")
    if args.data is not None and not args.data:
        raise ValueError("--data: empty folder name")


def load(args: argparse.Namespace):
    try:
        return load_hub(args.path, data_name_or_path=args.data, cpu=args.cpu, autocast_bf16=args.autocast_bf16,
                        max_context_eval=args.max_context_eval, max_answer_tokens=args.max_answer_tokens)  # fmt: skip
    except NotAQACheckpoint as e:
        raise ValueError(f"--path {e}") from None


def describe(answer: Answer, rank: int, top_k: int, source: str) -> list[str]:
    head = f"#{rank + 1} " if top_k > 1 else ""
    lines = [
        f"{head}answer: {answer.text}",
        f"{head}score: {answer.score:.4f}",
        f"{head}span: characters {answer.start}-{answer.end} of {source}",
    ]
    if answer.answer_type is not None:
        lines.append(f"{head}answer type: {answer.answer_type}")
    return lines


def ask_one(hub, args: argparse.Namespace) -> None:
    context = read_text(args.context, "--context")
    source = "standard input" if args.context == "-" else args.context
    try:
        encoded = hub.encode(args.question, context, args.context_overflow)
    except ValueError as e:
        flag = "--question" if str(e).startswith("the question") else f"--context {source}"
        raise ValueError(f"{flag}: {e}") from None
    answers = hub.answer_encoded([encoded], args.top_k, overlapping=args.overlapping_answers)[0]
    for rank, answer in enumerate(answers):
        print("\n".join(describe(answer, rank, args.top_k, source)))
    if encoded.truncated_at is not None:
        print(f"note: the context was cut to its first {hub.max_context_tokens} tokens (--max-context-eval); the "
              f"model read characters 0-{encoded.truncated_at} of {len(context)}")  # fmt: skip


class LineErrors(SkipLog):
    """The lines ``iter_json_lines`` cannot read (not UTF-8, not JSON), kept for the caller to answer in order."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[tuple[int, str]] = []

    def skip(self, where: str, reason: str, detail: str, example=None) -> None:
        self.errors.append((int(where.rsplit(":", 1)[1]), detail))


def jsonl_items(path: str, hub, overflow: str) -> Iterator[tuple[int, dict, EncodedQuestion | str]]:
    """(line number, what is echoed of the line, the encoded question or the line's error) of every non-blank line."""
    log = LineErrors()
    for lineno, obj in iter_json_lines("/dev/stdin" if path == "-" else path, log):
        while log.errors:  # the unreadable lines before this one
            bad, error = log.errors.pop(0)
            yield bad, {"line": bad}, error
        echo: dict = {"line": lineno}
        if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in ("question", "context")):
            yield lineno, echo, 'expected an object with string fields "question" and "context"'
            continue
        if "id" in obj:
            echo["id"] = obj["id"]
        unknown = ", ".join(json.dumps(key) for key in sorted(set(obj) - set(LINE_FIELDS)))
        if unknown:
            known = ", ".join(map(json.dumps, LINE_FIELDS))
            yield lineno, echo, f"unknown field(s) {unknown}: a line holds {known} (--top-k etc. are flags)"
            continue
        try:
            yield lineno, echo, hub.encode(obj["question"], obj["context"], overflow)
        except ValueError as e:
            yield lineno, echo, str(e)
    for bad, error in log.errors:
        yield bad, {"line": bad}, error


def ask_many(hub, args: argparse.Namespace) -> int:
    """Answer every line of --jsonl, writing each batch as soon as it is answered; returns the failed lines."""
    from tqdm import tqdm

    source = "standard input" if args.jsonl == "-" else args.jsonl
    failed, pending = [], []
    progress = tqdm(unit=" questions", file=sys.stderr, disable=not sys.stderr.isatty())

    def flush() -> None:
        good = [e for _, _, e in pending if isinstance(e, EncodedQuestion)]
        answers = iter(hub.answer_encoded(good, args.top_k, args.batch_size, args.overlapping_answers))
        for lineno, echo, item in pending:
            if isinstance(item, EncodedQuestion):
                out = {**echo, "answers": [a.to_json() for a in next(answers)]}
            else:
                out = {**echo, "error": item}
                failed.append(lineno)
                print(f"{source}:{lineno}: {item}", file=sys.stderr)
            print(json.dumps(out, ensure_ascii=False), flush=True)
        progress.update(len(pending))
        pending.clear()

    lines = 0
    for entry in jsonl_items(args.jsonl, hub, args.context_overflow):
        lines += 1
        pending.append(entry)
        if sum(isinstance(e, EncodedQuestion) for _, _, e in pending) >= args.batch_size:
            flush()
    flush()
    progress.close()
    if lines == 0:
        raise ValueError(f"--jsonl {source}: no question in it (empty, or blank lines only)")
    if failed:
        print(f"{source}: {len(failed)} line(s) could not be answered (first at line {failed[0]})", file=sys.stderr)
    return len(failed)


def main(args: argparse.Namespace) -> int:
    check_args(args)
    hub = load(args)
    if args.jsonl is None:
        ask_one(hub, args)
        return 0
    return ask_many(hub, args)


def cli_main() -> None:
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.WARNING, stream=sys.stderr
    )
    sys.exit(1 if run_cli(main, get_parser()) else 0)


if __name__ == "__main__":
    cli_main()
