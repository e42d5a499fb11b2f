"""The QA record (stage 1 of the QA data interface, examples/qa/FORMAT.md): what every converter writes, one JSON
object per line, and what the binariser reads.

A record is one question with its whole long context, given as a list of paragraphs. Gold answers are texts plus
character spans ``[paragraph, start, end)`` (end exclusive) into those paragraphs. Distantly supervised sets list
every occurrence of every answer (``find_occurrences``).
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO, TextIO

# Natural Questions answer types, in the order of the answer-type head's classes (the dataset's labels index this);
# a record of a span-only data set has answer_type None. "yes" / "no" (the BERT-joint baseline's YES / NO classes: a
# long answer whose short answer is the annotator's yes or no) come last, so that the first three classes of a
# checkpoint trained before they existed keep their meaning.
ANSWER_TYPES = ("none", "long", "short", "yes", "no")


class RecordError(ValueError):
    """A record that cannot be used. ``reason`` is the short key it is counted under in the skip summary."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class QARecord:
    id: str
    question: str
    paragraphs: list[str]
    answers: list[str] = field(default_factory=list)
    spans: list[list[int]] = field(default_factory=list)  # [paragraph, char_start, char_end), end exclusive
    answer_type: str | None = None  # Natural Questions only: one of ANSWER_TYPES
    long_answer: int = -1  # Natural Questions: index of the long-answer paragraph, -1 if none
    extra: dict[str, Any] = field(default_factory=dict)
    # Records that share one context (the questions of one SQuAD article) share a context_id; in a JSONL file only
    # the first of them carries "paragraphs", the others name the context_id instead (see ``read_records``).
    context_id: str | None = None

    def to_json(self, with_paragraphs: bool = True) -> str:
        obj = asdict(self)
        if self.context_id is None:
            del obj["context_id"]
        elif not with_paragraphs:
            del obj["paragraphs"]
        return json.dumps(obj, ensure_ascii=False)

    @classmethod
    def from_json(cls, obj: Any) -> QARecord:
        """Build and validate a record from a decoded JSON object; raises ``RecordError`` if it is unusable."""
        if not isinstance(obj, dict):
            raise RecordError("malformed", f"expected a JSON object, got {type(obj).__name__}")
        missing = [k for k in ("id", "question", "paragraphs") if k not in obj]
        if missing:
            raise RecordError("malformed", f"missing field(s) {', '.join(missing)}")
        known = {k: obj[k] for k in cls.__dataclass_fields__ if k in obj}
        record = cls(**known)
        record.validate()
        return record

    def validate(self) -> None:
        """Check types, span bounds and that every span's text is one of the answers (case and outer spaces aside)."""
        if not isinstance(self.id, str) or not self.id:
            raise RecordError("malformed", f"id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.question, str) or not self.question.strip():
            raise RecordError("empty_question", "the question is empty")
        if not isinstance(self.paragraphs, list) or not all(isinstance(p, str) for p in self.paragraphs):
            raise RecordError("malformed", "paragraphs must be a list of strings")
        if not any(p.strip() for p in self.paragraphs):
            raise RecordError("empty_context", "the context is empty (no paragraph has any text)")
        if not isinstance(self.answers, list) or not all(isinstance(a, str) for a in self.answers):
            raise RecordError("malformed", "answers must be a list of strings")
        if self.answer_type is not None and self.answer_type not in ANSWER_TYPES:
            raise RecordError(
                "malformed", f"answer_type must be null or one of {ANSWER_TYPES}, got {self.answer_type!r}"
            )
        if not isinstance(self.long_answer, int) or not -1 <= self.long_answer < len(self.paragraphs):
            raise RecordError("malformed", f"long_answer {self.long_answer!r} is not -1 or a paragraph index")
        if not isinstance(self.extra, dict):
            raise RecordError("malformed", "extra must be an object")
        if self.context_id is not None and not isinstance(self.context_id, str):
            raise RecordError("malformed", f"context_id must be a string, got {self.context_id!r}")
        wanted = {a.strip().casefold() for a in self.answers}
        for span in self.spans:
            if not (isinstance(span, list) and len(span) == 3 and all(type(v) is int for v in span)):
                raise RecordError("malformed", f"span {span!r} is not [paragraph, start, end]")
            p, start, end = span
            if not (0 <= p < len(self.paragraphs) and 0 <= start < end <= len(self.paragraphs[p])):
                raise RecordError("bad_span", f"span {span} lies outside paragraph {p}")
            text = self.paragraphs[p][start:end]
            if text.strip().casefold() not in wanted:
                raise RecordError("offset_mismatch", f"span {span} covers {text!r}, which is none of the answers")


def trim_span(text: str, start: int, end: int) -> tuple[int, int]:
    """Shrink ``[start, end)`` so that it neither starts nor ends with whitespace."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def find_occurrences(paragraphs: list[str], answers: list[str]) -> list[list[int]]:
    """Every case-insensitive occurrence of every answer, as whole words, as sorted unique spans."""
    spans = set()
    for answer in answers:
        answer = answer.strip()
        if not answer:
            continue
        # A word character at an answer's edge must not continue into the text: "mars" is not found in "marshal".
        left = r"(?<!\w)" if answer[0].isalnum() or answer[0] == "_" else ""
        right = r"(?!\w)" if answer[-1].isalnum() or answer[-1] == "_" else ""
        pattern = re.compile(left + re.escape(answer) + right, re.IGNORECASE)
        for p, text in enumerate(paragraphs):
            spans.update((p, m.start(), m.end()) for m in pattern.finditer(text))
    return [list(s) for s in sorted(spans)]


def skipped_example(record_id: Any, reason: str, extra: Any) -> dict[str, Any]:
    """What is kept of a skipped record: its id and reason, and from ``extra`` the data set's own id and gold
    annotations (Natural Questions: ``example_id``, ``annotations``), which the official evaluation still expects."""
    entry = {"id": record_id, "reason": reason}
    if isinstance(extra, dict):
        entry.update({k: extra[k] for k in ("example_id", "annotations") if k in extra})
    return entry


@dataclass
class SkippedRecord:
    """A line a converter writes for an example it could not turn into a record, so that the binariser and the
    prediction script still know the example exists (nq_eval.py rejects a prediction file that misses an id)."""

    id: str
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)  # example_id and, when they could be read, annotations

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "skipped": self.reason, "extra": self.extra}, ensure_ascii=False)


class SkipLog:
    """Counts skipped records and lost answers by reason, and prints a clear message for the first few of each.
    ``skipped_examples`` lists what ``skipped_example`` keeps of every skipped record that had an id."""

    def __init__(self, stream: TextIO | None = None, max_messages_per_reason: int = 20) -> None:
        self.stream = stream  # None: sys.stderr as it is when a message is printed
        self.max_messages = max_messages_per_reason
        self.skipped: Counter[str] = Counter()
        self.lost: Counter[str] = Counter()
        self.first: dict[str, str] = {}  # reason -> where it first happened, named in the summary
        self.skipped_examples: list[dict[str, Any]] = []

    def _say(self, counter: Counter[str], reason: str, where: str, message: str) -> None:
        counter[reason] += 1
        self.first.setdefault(reason, where)
        if counter[reason] <= self.max_messages:
            print(message, file=self.stream or sys.stderr)
        elif counter[reason] == self.max_messages + 1:
            print(
                f"(further '{reason}' messages are not shown; see the counts at the end)",
                file=self.stream or sys.stderr,
            )

    def skip(self, where: str, reason: str, detail: str, example: dict[str, Any] | None = None) -> None:
        """A whole record is dropped; ``where`` names the file and record (``path:line`` or ``path [id]``),
        ``example`` is what ``skipped_example`` keeps of it (None: it has no id)."""
        self._say(self.skipped, reason, where, f"{where}: skipped ({reason}): {detail}")
        if example is not None:
            self.skipped_examples.append(example)

    def lose(self, where: str, reason: str, detail: str) -> None:
        """Part of a record (an answer, a span) is dropped while the record itself is kept."""
        self._say(self.lost, reason, where, f"{where}: dropped ({reason}): {detail}")

    def summary(self, kept: int) -> str:
        """One line: what was kept, and per reason how many were skipped or lost and where the first one was (a
        skip must be findable from the summary alone: its messages may have scrolled away)."""
        parts = [f"kept {kept} examples"]
        parts.append("skipped " + (self._counts(self.skipped) or "none"))
        if self.lost:
            parts.append("answers lost " + self._counts(self.lost))
        return "; ".join(parts)

    def _counts(self, counter: Counter[str]) -> str:
        return ", ".join(f"{r}={n} (first at {self.first[r]})" for r, n in sorted(counter.items()))


def open_text(path: str) -> TextIO:
    """Open a text file for reading, gunzipping ``*.gz`` transparently."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def open_bytes(path: str) -> BinaryIO:
    """Open a file for reading bytes, gunzipping ``*.gz`` transparently."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def iter_json_lines(path: str, log: SkipLog) -> Iterator[tuple[int, Any]]:
    """Yield (line number, object) of a JSON Lines file; bad lines and a truncated file are logged, not raised.

    Lines are read as bytes and decoded one at a time: a line that is not UTF-8 is skipped on its own, like one that
    is not JSON, and every line after it is still read (a text stream would stop at the first bad byte).
    """
    lineno = 0
    with open_bytes(path) as f:
        try:
            for lineno, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    bad = f"byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line"
                    log.skip(f"{path}:{lineno}", "malformed", f"not valid UTF-8 ({bad})")
                    continue
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    log.skip(f"{path}:{lineno}", "malformed", f"not valid JSON ({e.msg} at column {e.colno})")
                    continue
                yield lineno, obj
        except (EOFError, OSError, zlib.error) as e:
            log.skip(f"{path}:{lineno + 1}", "truncated_file", f"the file ends early or is corrupt ({e}); stopped here")


def read_records(path: str, log: SkipLog) -> Iterator[tuple[str, QARecord]]:
    """Yield (``path:line [id]``, record) for every valid record of a QA JSONL file; invalid ones are logged, skipped.

    A record without "paragraphs" takes those of the latest earlier record with the same "context_id". A line a
    converter wrote for an example it skipped (``SkippedRecord``) is counted as skipped under the converter's reason.
    """
    contexts: dict[str, list[str]] = {}
    for lineno, obj in iter_json_lines(path, log):
        where = f"{path}:{lineno}"
        if isinstance(obj, dict) and "skipped" in obj:
            reason = str(obj["skipped"])
            example = skipped_example(obj.get("id"), reason, obj.get("extra"))
            log.skip(f"{where} [{obj.get('id')}]", reason, "the converter skipped this example", example)
            continue
        try:
            if isinstance(obj, dict) and isinstance(obj.get("context_id"), str):
                if "paragraphs" in obj:
                    contexts[obj["context_id"]] = obj["paragraphs"]
                elif obj["context_id"] in contexts:
                    obj = {**obj, "paragraphs": contexts[obj["context_id"]]}
                else:
                    raise RecordError(
                        "malformed", f"no paragraphs and no earlier record with context_id {obj['context_id']!r}"
                    )
            record = QARecord.from_json(obj)
        except (RecordError, TypeError) as e:
            reason = e.reason if isinstance(e, RecordError) else "malformed"
            rid = obj.get("id") if isinstance(obj, dict) else None
            example = skipped_example(rid, reason, obj.get("extra")) if rid else None
            log.skip(f"{where} [{rid}]" if rid else where, reason, str(e), example)
            continue
        yield f"{where} [{record.id}]", record
