"""An exported QA model against qa-ask, on held-out questions: transformers' pipeline("question-answering") over the
exported folder, in a fresh Python process with no network (sockets refused, Hugging Face offline), and qa-ask's hub
interface over the checkpoint it was exported from, on the first N questions of a binarised data folder's records,
whole contexts (the paragraphs joined at blank lines, as both split them).

    python -m benchmarks.hf_export_check EXPORT_DIR --checkpoint RUN/checkpoint_last.pt \
        --records data-bin/qa/pretrained/squad_article/jsonl/valid.jsonl --questions 40 [--json check.json]

Prints how many answers agree (text and character span), the largest score difference, how many are right (the gold
answers, exact text), and each side's seconds; exit 1 where any answer differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import stopwatch
from benchmarks.machine import cpu_model
from fairseq_clusterformer.qa.data.records import SkipLog, read_records
from fairseq_clusterformer.qa.model import ClusterFormerQAModel

# what a user's fresh process runs: the folder, loaded as the docs show, with no network to fall back on
FRESH_PROCESS = r"""
import json, socket, sys

def refuse(*args, **kwargs):
    raise OSError("no network here")

socket.socket.connect = socket.socket.connect_ex = refuse
from transformers import AutoModelForQuestionAnswering, AutoTokenizer, pipeline

folder, questions = sys.argv[1], sys.argv[2]
model = AutoModelForQuestionAnswering.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
qa = pipeline("question-answering", model=folder, trust_remote_code=True, local_files_only=True)
print(json.dumps({"model": type(model).__name__, "pipeline": type(qa).__name__,
                  "model_max_length": tokenizer.model_max_length}))
items = [json.loads(line) for line in open(questions, encoding="utf-8")]
for answer in qa([{"question": i["question"], "context": i["context"]} for i in items]):
    print(json.dumps(answer))
"""


def offline_env(hf_home: Path) -> dict[str, str]:
    import os

    return {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def pipeline_answers(export: Path, questions: Path, env: dict[str, str]) -> tuple[dict, list[dict]]:
    """(what loaded, one answer a question) from the pipeline in a fresh process."""
    with tempfile.TemporaryDirectory() as work:
        script = Path(work) / "fresh.py"
        script.write_text(FRESH_PROCESS, encoding="utf-8")
        proc = subprocess.run([sys.executable, str(script), str(export), str(questions)], env=env,
                              capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"the pipeline over {export} failed:\n{proc.stderr[-3000:]}")
    head, *lines = proc.stdout.strip().splitlines()
    return json.loads(head), [json.loads(line) for line in lines]


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export", type=Path, help="the folder fairseq-clusterformer-export-hf wrote")
    parser.add_argument("--checkpoint", type=Path, required=True, help="the checkpoint it was exported from")
    parser.add_argument("--records", type=Path, required=True, help="qa-binarize's records (jsonl) of the questions")
    parser.add_argument("--questions", type=int, default=40, help="the first N records")
    parser.add_argument("--json", type=Path, help="write the figures and both sides' answers here")
    return parser


def main(args: argparse.Namespace) -> dict:
    if not (args.export / "config.json").is_file():
        raise SystemExit(f"{args.export}: no config.json (not an export of fairseq-clusterformer-export-hf)")
    if not args.checkpoint.is_file():
        raise SystemExit(f"--checkpoint {args.checkpoint}: no such file")
    # the reader fills in the paragraphs a record shares with the first record of its context_id
    records = [record for (_, record), _ in zip(read_records(str(args.records), SkipLog()), range(args.questions))]
    items = [{"question": r.question, "context": "\n\n".join(r.paragraphs)} for r in records]
    with tempfile.TemporaryDirectory() as work:
        questions = Path(work) / "questions.jsonl"
        questions.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
        with stopwatch() as pipe:
            loaded, ours = pipeline_answers(args.export, questions, offline_env(Path(work) / "hf_home"))
    with stopwatch() as ask:
        hub = ClusterFormerQAModel.from_pretrained(str(args.checkpoint.parent), args.checkpoint.name, cpu=True)
        theirs = [answers[0].to_json() for answers in hub.answer_batch(items)]
    seconds = {"pipeline": round(pipe.wall, 1), "qa_ask": round(ask.wall, 1)}
    same = [(o["answer"], o["start"], o["end"]) == (t["text"], t["start"], t["end"]) for o, t in zip(ours, theirs)]
    report = {"export": str(args.export), "checkpoint": str(args.checkpoint), "questions": len(items),
              "loaded": loaded, "same_answers": sum(same),
              "max_score_difference": max(abs(o["score"] - t["score"]) for o, t in zip(ours, theirs)),
              "right": sum(o["answer"] in r.answers for o, r in zip(ours, records)),
              "seconds": seconds, "cpu": cpu_model()}  # fmt: skip
    print(f"| {loaded['model']} / {loaded['pipeline']}: {report['same_answers']} of {len(items)} answers equal "
          f"qa-ask's (text and span), largest score difference {report['max_score_difference']:.2e}; "
          f"{report['right']} right; pipeline {pipe.wall:.0f} s, qa-ask {ask.wall:.0f} s")  # fmt: skip
    if args.json is not None:
        report["answers"] = {"pipeline": ours, "qa_ask": theirs}
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if not all(same):
        raise SystemExit(f"{len(same) - sum(same)} answer(s) differ")
    return report


if __name__ == "__main__":
    main(get_parser().parse_args())
