"""Quasar-T: ``{split}_questions.json.gz`` with the matching ``contexts/{long,short}/{split}_contexts.json.gz``.

Both files are JSON Lines: questions ``{"uid", "question", "answer", "tags"}``, contexts ``{"uid", "contexts":
[[retrieval score, passage text], ...]}``. Records are joined on ``uid``; every passage is a paragraph. The answer
has no offsets (distant supervision): the spans are every whole-word, case-insensitive occurrence of it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from fairseq_clusterformer.qa.data.records import QARecord, SkipLog, find_occurrences, iter_json_lines


def _questions(path: str, log: SkipLog) -> dict[str, tuple[int, dict]]:
    questions = {}
    for lineno, q in iter_json_lines(path, log):
        where = f"{path}:{lineno}"
        if not (
            isinstance(q, dict)
            and isinstance(q.get("uid"), str)
            and isinstance(q.get("question"), str)
            and isinstance(q.get("answer"), str)
        ):
            log.skip(where, "malformed", 'expected {"uid", "question", "answer"} strings')
            continue
        questions[q["uid"]] = (lineno, q)
    return questions


def convert(path: str, args: argparse.Namespace, log: SkipLog) -> Iterator[QARecord]:
    if not args.contexts:
        raise ValueError("--format quasart needs --contexts, the {split}_contexts.json.gz file of the same split")
    questions = _questions(path, log)
    seen = set()
    for lineno, c in iter_json_lines(args.contexts, log):
        where = f"{args.contexts}:{lineno}"
        uid = c.get("uid") if isinstance(c, dict) else None
        if uid not in questions:
            log.skip(where, "no_question", f"uid {uid!r} is not in {path}")
            continue
        passages = c.get("contexts")
        if not isinstance(passages, list) or not all(
            isinstance(x, list) and len(x) == 2 and isinstance(x[1], str) for x in passages
        ):
            log.skip(f"{where} [{uid}]", "malformed", "contexts must be a list of [score, text] pairs")
            continue
        seen.add(uid)
        q = questions[uid][1]
        paragraphs = [text for _, text in passages]
        yield QARecord(
            id=uid,
            question=q["question"],
            paragraphs=paragraphs,
            answers=[q["answer"]],
            spans=find_occurrences(paragraphs, [q["answer"]]),
            extra={"tags": q.get("tags", []), "scores": [score for score, _ in passages]},
        )
    for uid in questions.keys() - seen:
        log.skip(f"{path}:{questions[uid][0]} [{uid}]", "no_context", f"no line of {args.contexts} has this uid")
