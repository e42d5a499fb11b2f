"""SQuAD-format files (v1.1 and v2.0): a whole article, all its paragraphs, is one long context.

Every question of the article becomes one record whose context is the article; its gold spans point into the
paragraph the question was written for. With ``--context-unit paragraph`` the context is that paragraph alone (SQuAD's
own reading-comprehension setting: short contexts that a small model trained on a CPU can learn from).
v2.0 questions marked ``is_impossible`` get no answers (the no-answer case). An answer whose ``answer_start`` does not
point at its text is dropped with a message; a question left with no answer that was not meant to be unanswerable is
skipped.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

from fairseq_clusterformer.qa.data.records import QARecord, SkipLog, open_text, trim_span


def _load(path: str) -> list:
    try:
        with open_text(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a SQuAD JSON file ({e.msg} at line {e.lineno}, column {e.colno})") from e
    except (EOFError, OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the file ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f'{path}: not a SQuAD file: expected {{"version": ..., "data": [articles]}}')
    return data["data"]


def _answers(qa: dict, context: str, where: str, log: SkipLog) -> tuple[list[str], list[tuple[int, int]]]:
    """Answer texts and their trimmed character spans in ``context``; bad ones are logged and left out."""
    texts, spans = [], []
    for answer in qa.get("answers") or []:
        if not (
            isinstance(answer, dict) and isinstance(answer.get("text"), str) and type(answer.get("answer_start")) is int
        ):
            log.lose(where, "malformed_answer", f"answer {answer!r} has no text string and integer answer_start")
            continue
        text, start = answer["text"], answer["answer_start"]
        found = context[start : start + len(text)]
        if found != text or not text.strip():
            log.lose(
                where, "offset_mismatch", f"answer {text!r} at answer_start {start}: the context there reads {found!r}"
            )
            continue
        if text.strip() not in texts:
            texts.append(text.strip())
        spans.append(trim_span(context, start, start + len(text)))
    return texts, sorted(set(spans))


def article_slice(text: str) -> slice:
    """``--articles START:END`` as a slice of the file's articles."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        return slice(*(int(v) if v.strip() else None for v in parts))
    except ValueError:
        raise ValueError(f"--articles {text!r}: expected START:END, e.g. 0:40") from None


def load_articles(path: str, spec: str) -> tuple[list, range]:
    """The articles of a SQuAD file and the indices that ``--articles`` (``spec``, START:END) chooses."""
    articles = _load(path)
    return articles, range(len(articles))[article_slice(spec)]


def convert(path: str, args: argparse.Namespace, log: SkipLog) -> Iterator[QARecord]:
    articles, chosen = load_articles(path, getattr(args, "articles", ":"))
    unit = getattr(args, "context_unit", "article")
    if unit not in ("article", "paragraph"):
        raise ValueError(f"--context-unit {unit!r}: expected article or paragraph")
    for a in chosen:
        article = articles[a]
        title = article.get("title", "") if isinstance(article, dict) else ""
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list) or not all(
            isinstance(p, dict) and isinstance(p.get("context"), str) for p in paragraphs
        ):
            log.skip(f"{path} [article {a}]", "malformed", "the article has no list of paragraphs with a context")
            continue
        contexts = [p["context"] for p in paragraphs]
        for p, paragraph in enumerate(paragraphs):
            for qa in paragraph.get("qas") or []:
                where = f"{path} [article {a} {title!r}, paragraph {p}, question {qa.get('id')}]"
                if not isinstance(qa.get("id"), str) or not isinstance(qa.get("question"), str):
                    log.skip(where, "malformed", "the question has no string id and question")
                    continue
                impossible = bool(qa.get("is_impossible", False))
                texts, spans = ([], []) if impossible else _answers(qa, contexts[p], where, log)
                if not impossible and not texts:
                    log.skip(where, "no_valid_answer", "no answer of this (answerable) question matches the context")
                    continue
                # the paragraph's own record index is 0 when it is the whole context
                whole = unit == "article"
                yield QARecord(
                    id=qa["id"],
                    question=qa["question"],
                    paragraphs=contexts if whole else [contexts[p]],
                    answers=texts,
                    spans=[[p if whole else 0, s, e] for s, e in spans],
                    extra={"title": title, "paragraph": p},
                    context_id=f"{title or 'article'}#{a}" + ("" if whole else f"/{p}"),
                )
