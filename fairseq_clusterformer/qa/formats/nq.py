"""Natural Questions, simplified JSONL (``simplified-nq-train.jsonl.gz``); original-format lines (the dev set) are
simplified on the fly as Google's ``simplify_nq_example`` does (tokens joined by spaces).

The top-level long-answer candidates become the paragraphs, in document order; a paragraph's text is its document
tokens without the HTML tag tokens (``<P>``, ``</Td>``, ...), joined by single spaces, and ``extra.candidates`` keeps
which document tokens it is made of, so that a predicted span maps back to document token offsets exactly.
Labels come from the first annotation with a long answer (train has one annotation, dev five): ``long_answer`` is
the index of its top-level candidate, the paragraph the model learns to pick, the short answers are the spans,
``answer_type`` is none / long / short / yes / no (the BERT-joint baseline's classes: short when the annotation has
short spans, else its yes/no answer, else long; ``extra.yes_no_answer`` keeps the yes/no answer too).
The official gold is the annotated candidate itself: ``extra.long_answer_tokens`` keeps its own document token span
and ``extra.annotations`` every annotation's spans, which the official evaluation compares with the predicted span.
An annotated candidate nested in a top-level one (a table row, a list item) therefore differs from the paragraph
the model answers with, and the converter counts such examples (``nested_long_answer``).
An example that cannot be converted is written as a ``SkippedRecord`` line (its example_id and, when they can be
read, its annotations), so that the prediction file can still answer it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from fairseq_clusterformer.qa.data.records import QARecord, RecordError, SkipLog, SkippedRecord, iter_json_lines

_HTML = re.compile(r"^</?[A-Za-z][^<>]*>$")


def _document_tokens(example: dict) -> list[str]:
    if isinstance(example.get("document_text"), str):
        return example["document_text"].split(" ")
    if isinstance(example.get("document_tokens"), list):
        return [t["token"].replace(" ", "_") for t in example["document_tokens"]]
    raise RecordError("malformed", "no document_text (simplified) or document_tokens (original format)")


def _paragraph(tokens: list[str], start: int, end: int) -> tuple[str, list[list[int]], list[int]]:
    """Text of document tokens [start, end) without HTML tags, the runs of kept tokens, and the kept token ids."""
    kept = [i for i in range(start, end) if not _HTML.match(tokens[i])]
    runs: list[list[int]] = []
    for i in kept:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return " ".join(tokens[i] for i in kept), runs, kept


def _record(example: dict) -> QARecord:
    if (
        not isinstance(example, dict)
        or "example_id" not in example
        or not isinstance(example.get("question_text"), str)
    ):
        raise RecordError("malformed", "not a Natural Questions example (no example_id / question_text)")
    tokens = _document_tokens(example)
    candidates = example.get("long_answer_candidates") or []
    top = [c for c, cand in enumerate(candidates) if cand.get("top_level", True)]
    if not top:
        raise RecordError("empty_context", "the document has no top-level long-answer candidate")
    paragraphs, infos, word_of_token = [], [], {}
    for p, c in enumerate(top):
        start, end = candidates[c]["start_token"], candidates[c]["end_token"]
        if not 0 <= start < end <= len(tokens):
            raise RecordError("bad_span", f"candidate {c} [{start}, {end}) lies outside the {len(tokens)} tokens")
        text, runs, kept = _paragraph(tokens, start, end)
        offset = 0
        for i in kept:
            word_of_token[i] = (p, offset, offset + len(tokens[i]))  # paragraph, char start, char end
            offset += len(tokens[i]) + 1
        paragraphs.append(text)
        infos.append({"index": c, "start_token": start, "end_token": end, "words": runs})

    annotations = example.get("annotations") or []
    label = next((a for a in annotations if a["long_answer"]["candidate_index"] >= 0), None)
    long_answer, answers, spans, yes_no, long_tokens = -1, [], [], "NONE", [-1, -1]
    if label is not None:
        la = label["long_answer"]
        long_tokens = [la["start_token"], la["end_token"]]
        # the top-level candidate that holds the annotated one (itself when it is top-level)
        long_answer = next(
            (
                p
                for p, info in enumerate(infos)
                if info["start_token"] <= la["start_token"] and la["end_token"] <= info["end_token"]
            ),
            -1,
        )
        if long_answer < 0:
            raise RecordError("bad_span", f"the long answer {la} lies in no top-level candidate")
        yes_no = label.get("yes_no_answer", "NONE")
        for short in label.get("short_answers") or []:
            words = [word_of_token[i] for i in range(short["start_token"], short["end_token"]) if i in word_of_token]
            if not words or words[0][0] != words[-1][0]:
                raise RecordError("bad_span", f"short answer {short} covers no text of one paragraph")
            p, start, end = words[0][0], words[0][1], words[-1][2]
            spans.append([p, start, end])
            if paragraphs[p][start:end] not in answers:
                answers.append(paragraphs[p][start:end])
    # short spans win over a yes/no answer, as in the baseline (an annotation has one or the other in NQ)
    yes_no_type = {"YES": "yes", "NO": "no"}.get(str(yes_no).upper(), "long")
    answer_type = "none" if long_answer < 0 else "short" if spans else yes_no_type
    return QARecord(
        id=str(example["example_id"]),
        question=example["question_text"],
        paragraphs=paragraphs,
        answers=answers,
        spans=sorted(spans),
        answer_type=answer_type,
        long_answer=long_answer,
        extra={
            "example_id": example["example_id"],
            "candidates": infos,
            "annotations": _annotations(annotations),
            "yes_no_answer": yes_no,
            "long_answer_tokens": long_tokens,
        },
    )


def _annotations(annotations: list) -> list[dict]:
    """The official gold of every annotation, in token offsets (what nq_eval.py compares)."""
    return [
        {
            "long_answer": {k: a["long_answer"][k] for k in ("start_token", "end_token", "candidate_index")},
            "short_answers": [
                {"start_token": s["start_token"], "end_token": s["end_token"]} for s in a.get("short_answers") or []
            ],
            "yes_no_answer": a.get("yes_no_answer", "NONE"),
        }
        for a in annotations
    ]


def _skipped(example: dict, reason: str) -> SkippedRecord:
    extra = {"example_id": example["example_id"]}
    try:
        extra["annotations"] = _annotations(example.get("annotations") or [])
    except (KeyError, TypeError, AttributeError):
        pass  # unreadable annotations: the prediction script counts the example as having no gold answer
    return SkippedRecord(id=str(example["example_id"]), reason=reason, extra=extra)


def convert(path: str, args: argparse.Namespace, log: SkipLog) -> Iterator[QARecord | SkippedRecord]:
    for lineno, example in iter_json_lines(path, log):
        try:
            record = _record(example)
        except (RecordError, KeyError, TypeError, IndexError) as e:
            reason = e.reason if isinstance(e, RecordError) else "malformed"
            detail = str(e) if isinstance(e, RecordError) else f"missing or bad field {e}"
            eid = example.get("example_id") if isinstance(example, dict) else None
            log.skip(f"{path}:{lineno} [{eid}]", reason, detail)
            if isinstance(eid, (int, str)) and not isinstance(eid, bool):
                yield _skipped(example, reason)  # the binariser records it, the prediction script answers it null
            continue
        if is_nested(record.extra):
            log.lose(
                f"{path}:{lineno} [{record.id}]",
                "nested_long_answer",
                f"the annotated long answer {record.extra['long_answer_tokens']} is nested in top-level candidate "
                f"{record.long_answer}, the model's only way to answer it, which the official metric counts as wrong",
            )
        yield record


def is_nested(extra: dict) -> bool:
    """Whether the record's gold long answer is a candidate inside a top-level one rather than the paragraph."""
    tokens = extra["long_answer_tokens"]
    return tokens[0] >= 0 and not any([c["start_token"], c["end_token"]] == tokens for c in extra["candidates"])
