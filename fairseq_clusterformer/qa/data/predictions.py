"""Predictions in each data set's official format, from predicted token spans of the binarised contexts.

- SQuAD / Quasar-T / SearchQA: ``{"question id": "answer text"}`` JSON, what ``evaluate-v1.1.py`` reads.
- Natural Questions: ``{"predictions": [{"example_id", "long_answer": {start_token, end_token, start_byte,
  end_byte}, "long_answer_score", "short_answers": [...], "short_answers_score", "yes_no_answer"}]}``, what
  ``nq_eval.py`` reads. Offsets are document token offsets; byte offsets are -1, which ``nq_eval.py`` takes as
  "compare token offsets".

    from fairseq_clusterformer.qa.data.predictions import nq_prediction, write_nq_predictions, write_squad_predictions
    write_squad_predictions("pred.json", {meta["id"]: split.span_text(i, start, end), ...})
    pred = nq_prediction(split.tokenizer, example.context, example.meta, answer_type, long_paragraph, long_score,
                         short_span, short_score)
    write_nq_predictions("nq-pred.json", with_null_predictions({example_id: pred, ...}, every_example_id))

``nq_eval.py`` rejects a file whose example ids differ from the gold's, so ``with_null_predictions`` adds a null
answer for every example the model did not read (a context the dataset skipped), scored below every real one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fairseq_clusterformer.atomic_files import atomic_open
from fairseq_clusterformer.qa.data.binarized import span_in_paragraph
from fairseq_clusterformer.qa.data.records import ANSWER_TYPES

NULL_SPAN = {"start_token": -1, "end_token": -1, "start_byte": -1, "end_byte": -1}


def answer_type_name(kind: int | None) -> str:
    """The answer type a decoded class stands for (``ops.spans.AnswerPrediction.answer_type``); a span-only model
    (no answer-type head: None) answers every question with its span, a short answer."""
    return "short" if kind is None else ANSWER_TYPES[kind]


def write_squad_predictions(path: str, answers: Mapping[str, str]) -> None:
    """SQuAD-style prediction file: one answer text per question id."""
    with atomic_open(path) as f:
        json.dump(dict(answers), f, ensure_ascii=False, indent=1)
        f.write("\n")


def _token_span(start: int, end: int) -> dict[str, int]:
    return {"start_token": int(start), "end_token": int(end), "start_byte": -1, "end_byte": -1}


def _word_to_document(runs: Sequence[Sequence[int]], word: int) -> int:
    """Document token of the ``word``-th word of a paragraph made of the document token ``runs``."""
    for start, end in runs:
        if word < end - start:
            return start + word
        word -= end - start
    raise IndexError("word index beyond the paragraph")


def short_answer_tokens(tokenizer, context: Any, meta: Mapping, start: int, end: int) -> tuple[int, int, int] | None:
    """(paragraph, start_token, end_token) in NQ document tokens of the inclusive context token span [start, end].

    The paragraph text of an NQ record is its document tokens joined by single spaces, so the words a span covers
    are counted by the spaces before it. None if the span covers no word.
    """
    where = span_in_paragraph(tokenizer, context, meta["paragraph_starts"], start, end)
    if where is None:
        return None
    p, byte_start, byte_end = where
    paragraph_starts = meta["paragraph_starts"]
    context = np.asarray(context)
    stop = paragraph_starts[p + 1] if p + 1 < len(paragraph_starts) else len(context)
    text = tokenizer.decode_bytes(context[paragraph_starts[p] + 1 : stop])
    first_word = text.count(b" ", 0, byte_start)
    last_word = text.count(b" ", 0, byte_end - 1)
    runs = meta["extra"]["candidates"][p]["words"]
    return p, _word_to_document(runs, first_word), _word_to_document(runs, last_word) + 1


def nq_prediction(
    tokenizer,
    context: Any,
    meta: Mapping,
    answer_type: str,
    long_paragraph: int,
    long_score: float,
    short_span: tuple[int, int] | None = None,
    short_score: float = 0.0,
) -> dict[str, Any]:
    """One official NQ prediction.

    ``answer_type`` is "none" (null long and short answer), "long" (long answer only), "short" (long answer and a
    short span) or "yes" / "no" (long answer and ``yes_no_answer`` YES / NO, no short span: nq_eval.py rejects a
    yes/no prediction with short spans); ``long_paragraph`` indexes ``meta["paragraph_starts"]`` (the top-level
    candidates); ``short_span`` is an inclusive context token span. ``short_score`` is the short answer's score,
    a yes/no answer's included.
    """
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"answer_type must be one of {ANSWER_TYPES}, got {answer_type!r}")
    candidates = meta["extra"]["candidates"]
    long_answer, short_answers = dict(NULL_SPAN), []
    if answer_type != "none":
        if not 0 <= long_paragraph < len(meta["paragraph_starts"]):
            raise ValueError(f"{meta['id']}: long_paragraph {long_paragraph} is not a paragraph of the context")
        candidate = candidates[long_paragraph]
        long_answer = _token_span(candidate["start_token"], candidate["end_token"])
    if answer_type == "short" and short_span is not None:
        located = short_answer_tokens(tokenizer, context, meta, *short_span)
        if located is not None:
            short_answers.append(_token_span(located[1], located[2]))
    return {
        "example_id": meta["extra"]["example_id"],
        "long_answer": long_answer,
        "long_answer_score": float(long_score),
        "short_answers": short_answers,
        "short_answers_score": float(short_score),
        "yes_no_answer": answer_type.upper() if answer_type in ("yes", "no") else "NONE",
    }


def null_nq_prediction(example_id: Any, score: float) -> dict[str, Any]:
    """The prediction "no long and no short answer", with ``score`` as both scores."""
    return {
        "example_id": example_id,
        "long_answer": dict(NULL_SPAN),
        "long_answer_score": float(score),
        "short_answers": [],
        "short_answers_score": float(score),
        "yes_no_answer": "NONE",
    }


def with_null_predictions(predictions: Mapping[Any, Mapping[str, Any]], example_ids: Sequence[Any]) -> list[dict]:
    """One prediction per id of ``example_ids``, in that order: the given one, or a null answer scored 1 below the
    lowest score given (so that the official threshold sweep reaches it last; a null answer never counts as
    predicted, so it changes no precision or recall)."""
    extra = set(predictions) - set(example_ids)
    if extra:
        raise ValueError(f"{len(extra)} predictions for ids that are not in the split, e.g. {next(iter(extra))!r}")
    scores = [p[key] for p in predictions.values() for key in ("long_answer_score", "short_answers_score")]
    scores = [s for s in scores if math.isfinite(s)]  # a context without any answer position scores -inf
    lowest = min(scores, default=1.0) - 1.0
    return [dict(predictions[i]) if i in predictions else null_nq_prediction(i, lowest) for i in example_ids]


def write_nq_predictions(path: str, predictions: Sequence[Mapping[str, Any]]) -> None:
    with atomic_open(path) as f:
        json.dump({"predictions": list(predictions)}, f)
        f.write("\n")
