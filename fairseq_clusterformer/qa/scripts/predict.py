"""fairseq-clusterformer-qa-predict: answer the questions of a binarised split with a trained clusterformer_qa
checkpoint, write the predictions in the data set's official format and print EM / F1 (NQ: long / short F1 of
every written answer and at the best score threshold, as nq_eval.py reports them).

    fairseq-clusterformer-qa-predict data-bin/squad --path checkpoints/checkpoint_best.pt --split valid \
        --output predictions.json

SQuAD, Quasar-T and SearchQA get ``{"question id": "answer"}`` (evaluate-v1.1.py's input); Natural Questions
data (answer types in the meta) gets nq_eval.py's ``{"predictions": [...]}``, with a null answer for every example
the model could not take and every one the converter or the binariser skipped (qa_config.json lists them), since
nq_eval.py rejects a file that misses an id. Scores average over every question
of the split: one the model could not take (a context over --max-context-eval, ...) counts as unanswered.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
from fairseq import utils

from fairseq_clusterformer.atomic_files import check_writable
from fairseq_clusterformer.qa.data.predictions import (
    answer_type_name,
    nq_prediction,
    with_null_predictions,
    write_nq_predictions,
    write_squad_predictions,
)
from fairseq_clusterformer.qa.model import ClusterFormerQAModel
from fairseq_clusterformer.qa.ops.metrics import (
    NQLabel,
    nq_label_from_json,
    nq_prediction_from_json,
    nq_scores,
    squad_scores,
)
from fairseq_clusterformer.qa.ops.spans import AnswerPrediction
from fairseq_clusterformer.scripts.cli_logging import run_cli
from fairseq_clusterformer.scripts.model_loading import load_model

logger = logging.getLogger("fairseq_clusterformer.qa_predict")


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairseq-clusterformer-qa-predict", description=__doc__.split("\n")[0])
    parser.add_argument("data", help="directory written by fairseq-clusterformer-qa-binarize")
    parser.add_argument("--path", required=True, help="clusterformer_qa checkpoint")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--output", required=True, help="prediction file (official format of the data set)")
    parser.add_argument("--batch-size", type=int, default=4, help="questions per forward pass")
    parser.add_argument("--max-context-eval", type=int, help="longest context (default: the checkpoint's task's)")
    parser.add_argument("--max-answer-tokens", type=int, help="longest answer span (default: the checkpoint's)")
    parser.add_argument(
        "--nq-threshold",
        type=int,
        default=1,
        help="NQ: non-null annotations that make the gold answered: 2 for the official 5-way annotated dev set "
        "(nq_eval.py's rule), 1 for a split of the single-annotated training set",
    )
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    parser.add_argument(
        "--autocast-bf16",
        action="store_true",
        help="run the layers under torch.autocast(bfloat16) (heads in float32): faster on a GPU and on a CPU with "
        "native bfloat16 (AVX512-BF16 / AMX); warns, naming both matmul rates, where bfloat16 is slower",
    )
    return parser


def load(args: argparse.Namespace):
    overrides = {"data": args.data, "roberta_path": None}  # the trained weights replace any pretrained ones
    for key in ("max_context_eval", "max_answer_tokens"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    bf16 = getattr(args, "autocast_bf16", False)  # callers that build their own Namespace may leave it out
    needed = "qa-predict needs a clusterformer_qa checkpoint (trained with --task clusterformer_qa)"
    model, _, task = load_model(args.path, overrides, ClusterFormerQAModel, needed, args.cpu, bf16)
    return model, task


@torch.no_grad()
def predict(model, task, split: str, batch_size: int) -> Iterator[tuple[int, AnswerPrediction]]:
    """Yield (example index, decoded answer) per kept question, decoded as validation decodes them."""
    task.load_dataset(split)
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(dataset, max_sentences=batch_size).next_epoch_itr(shuffle=False)
    device = next(model.parameters()).device
    for sample in itr:
        sample = utils.move_to_cuda(sample, device) if device.type == "cuda" else sample
        logits = model(**sample["net_input"])
        yield from zip(sample["example_index"], task.decode_answers(logits, sample["net_input"]["context"]))


def main(args: argparse.Namespace) -> dict[str, float]:
    check_writable(args.output)  # before the model is loaded and every question answered
    model, task = load(args)
    data = task.split_data(args.split)
    results = list(predict(model, task, args.split, args.batch_size))
    print(f"| {task.dataset(args.split).report()}")
    if not task.answer_types:
        # the text of the context the model read: a training split's cut may have moved its paragraphs
        answers = {data.metas[i]["id"]: task.answer_text(args.split, i, pred.start, pred.end) for i, pred in results}
        write_squad_predictions(args.output, answers)
        scores = squad_scores({meta["id"]: meta["answers"] for meta in data.metas}, answers)
        print(f"| {args.split}: {len(answers)} of {len(data)} questions answered -> {args.output}")
        print_unscored(data.config, args.split, 0)
        print(f"| EM {scores['exact_match']:.2f} | F1 {scores['f1']:.2f}")
        return scores
    if data.texts is not None:
        # NQ's short answers are counted in document words from the decoded paragraph text, which an uncased
        # WordPiece context cannot give back; its stored offsets are not yet wired into the NQ writer
        raise SystemExit(
            f"{args.data}: Natural Questions data binarised with --tokenizer hf cannot be written as official NQ "
            "predictions yet; binarise it with --tokenizer gpt2 or sentencepiece"
        )
    if task.dataset(args.split).moves_positions:
        # NQ predictions carry token offsets of the original document, which a cut around the gold answers moves
        raise SystemExit(
            f"--split {args.split}: its contexts were cut around the gold answers (a training split over the context "
            "limit); NQ predictions need the original offsets: predict a valid or test split"
        )
    predictions = {}
    for i, pred in results:
        example = data[i]
        predictions[data.metas[i]["extra"]["example_id"]] = nq_prediction(
            data.tokenizer,
            example.context,
            example.meta,
            answer_type_name(pred.answer_type),
            pred.paragraph,
            pred.paragraph_score,
            (pred.start, pred.end),
            pred.span_score,
        )
    # nq_eval.py needs a prediction for every example id: the ones the dataset skipped, and the ones the converter
    # or the binariser skipped (qa_config.json lists them), get a null answer
    golds = nq_golds(data.metas, skipped_before(data.config, args.split))
    written = with_null_predictions(predictions, list(golds))
    write_nq_predictions(args.output, written)
    scores = nq_scores(golds, {p["example_id"]: nq_prediction_from_json(p) for p in written}, args.nq_threshold)
    before = len(golds) - len(data)
    print(
        f"| {args.split}: {len(predictions)} of {len(golds)} questions answered -> {args.output}"
        + (f"; {before} of the ids were skipped by the converter or the binariser" if before else "")
    )
    print_unscored(data.config, args.split, before)
    for line in nq_report(scores, args.nq_threshold):
        print(line)
    return scores


def print_unscored(config: dict, split: str, answered_null: int) -> None:
    """Name the source records that no score counts (skipped by the converter or the binariser, and not among the
    ``answered_null`` given a null answer): a split is never scored on a subset without a word."""
    entry = config.get("splits", {}).get(split, {})
    skipped, first = entry.get("skipped", {}), entry.get("first_skipped", {})
    unscored = sum(skipped.values()) - answered_null
    if unscored > 0:
        reasons = ", ".join(f"{r}={n}" + (f" (first at {first[r]})" if r in first else "") for r, n in skipped.items())
        print(f"| {split}: {unscored} record(s) of {entry.get('source')} are not in these scores: skipped ({reasons})")


def skipped_before(config: dict, split: str) -> list[dict]:
    """The examples of ``split`` that the converter or the binariser skipped, with the data set's id (a binarised
    directory written before they were recorded has none)."""
    entries = config.get("splits", {}).get(split, {}).get("skipped_examples", [])
    return [e for e in entries if "example_id" in e]


def nq_golds(metas: list[dict], skipped: list[dict]) -> dict[Any, list[NQLabel]]:
    """The official gold of every example id: the binarised examples', then the skipped ones' (an example without
    readable annotations counts as having no gold answer)."""
    golds = {}
    for item in [meta["extra"] for meta in metas] + skipped:
        golds[item["example_id"]] = [nq_label_from_json(a) for a in item.get("annotations") or []] or [NQLabel()]
    return golds


def nq_report(scores: dict[str, float], non_null_threshold: int) -> list[str]:
    """The printed NQ result lines: F1 / P / R of every written answer (what nq_eval.py --pretty_print calls
    "ignoring scores"), then at the best score threshold (nq_eval.py's default output and the leaderboard's number)."""

    def pct(kind: str, key: str) -> str:
        return f"{100 * scores[f'{kind}-{key}']:.2f}"

    every = " | ".join(f"{kind} F1 {pct(kind, 'f1')}" for kind in ("long", "short"))
    pr = ", ".join(f"{kind} {pct(kind, 'precision')} / {pct(kind, 'recall')}" for kind in ("long", "short"))
    best = " | ".join(
        f"{kind} F1 {pct(kind, 'best-threshold-f1')} (P {pct(kind, 'best-threshold-precision')} "
        f"R {pct(kind, 'best-threshold-recall')} at score >= {scores[f'{kind}-best-threshold-threshold']:.4g})"
        for kind in ("long", "short")
    )
    return [
        f"| {every} | every written answer; P / R {pr}; gold answered by >= {non_null_threshold} annotations",
        f"| best threshold: {best}",
    ]


def cli_main() -> None:
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stderr
    )
    wall, cpu = time.monotonic(), time.process_time()
    scores = run_cli(main, get_parser())
    # the scoring's own cost, model load included: a results collector cannot tell it from file times once a
    # stopped scoring was run again (process_time counts every thread of this process)
    print(f"| scoring: {time.monotonic() - wall:.0f} s wall, {time.process_time() - cpu:.0f} s CPU")
    print(json.dumps(scores))


if __name__ == "__main__":
    cli_main()
