"""SearchQA, in either published form:

- the processed text files ``SearchQA/{train,val,test}.txt``: one question per line,
  ``<s> snippet </s>  <s> snippet </s> ||| question ||| answer``; record ids are ``{file stem}-{line number}``;
- the per-question JSON files (``data_json``: one ``%06d-tag.json`` object per question with ``id``, ``question``,
  ``answer`` and ``search_results: [{"title", "url", "snippet", "related_links"}]``): give the directory.

Every snippet is a paragraph (snippets that are null are left out). The answer has no offsets (distant supervision):
the spans are every whole-word, case-insensitive occurrence of it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Iterator

from fairseq_clusterformer.qa.data.records import QARecord, SkipLog, find_occurrences, open_text

_SNIPPET = re.compile(r"<s>(.*?)</s>", re.DOTALL)


def _record(rid: str, question: str, answer: str, paragraphs: list[str], extra: dict) -> QARecord:
    return QARecord(
        id=rid,
        question=question,
        paragraphs=paragraphs,
        answers=[answer],
        spans=find_occurrences(paragraphs, [answer]),
        extra=extra,
    )


def _from_text(path: str, log: SkipLog) -> Iterator[QARecord]:
    stem = os.path.basename(path).split(".")[0]
    with open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("|||")
            snippets = _SNIPPET.findall(fields[0]) if len(fields) == 3 else []
            if not snippets:
                log.skip(f"{path}:{lineno}", "malformed", "expected '<s> snippet </s> ... ||| question ||| answer'")
                continue
            yield _record(f"{stem}-{lineno}", fields[1].strip(), fields[2].strip(), [s.strip() for s in snippets], {})


def _from_json_dir(path: str, log: SkipLog) -> Iterator[QARecord]:
    for name in sorted(n for n in os.listdir(path) if n.endswith(".json")):
        where = os.path.join(path, name)
        try:
            with open(where, encoding="utf-8") as f:
                obj = json.load(f)
            results = obj["search_results"]
            snippets = [r["snippet"] for r in results if r.get("snippet")]
            question, answer, rid = obj["question"], obj["answer"], str(obj["id"])
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
            log.skip(where, "malformed", f"not a SearchQA question file ({type(e).__name__}: {e})")
            continue
        extra = {k: obj.get(k) for k in ("category", "air_date", "value", "round", "show_number")}
        yield _record(rid, str(question), str(answer), snippets, extra)


def convert(path: str, args: argparse.Namespace, log: SkipLog) -> Iterator[QARecord]:
    if os.path.isdir(path):
        return _from_json_dir(path, log)
    return _from_text(path, log)
