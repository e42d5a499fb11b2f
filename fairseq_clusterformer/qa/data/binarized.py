"""The binarised QA format (stage 2 of examples/qa/FORMAT.md): writer, reader, and predicted span -> answer text.

Q = question tokens, N = context tokens.

A data directory holds
  dict.txt                      fairseq Dictionary, with the paragraph symbol "<p>"
  qa_config.json                tokenizer and its files, paragraph token, per split: examples and skip counts
  {split}.question.{bin,idx}    fairseq mmap indexed dataset, question ids (no <s> / </s>)
  {split}.context.{bin,idx}     context ids, "<p> paragraph ..." for every paragraph
  {split}.meta.jsonl            one line per example, same order: id, question, answers, spans (inclusive context
                                token indices), answer_type, long_answer, paragraph_starts, gold_in_context, extra
and, for a tokeniser that is not lossless (--tokenizer hf), the original text and token offsets of every context
(``qa_context_text.py``: {split}.offsets.{bin,idx}, {split}.texts.jsonl, "text_index" in the meta lines).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from fairseq.data import Dictionary, indexed_dataset

from fairseq_clusterformer.atomic_files import AtomicFiles, atomic_open
from fairseq_clusterformer.qa.data.context_text import (
    TEXT_INDEX,
    ContextTexts,
    ContextTextWriter,
    span_text_from_offsets,
)
from fairseq_clusterformer.qa.data.encode import EncodedExample
from fairseq_clusterformer.qa.data.tokenizers import PARAGRAPH_TOKEN, build_tokenizer, located

CONFIG = "qa_config.json"


def load_config(data_dir: str) -> dict[str, Any]:
    path = os.path.join(data_dir, CONFIG)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} not found: is {data_dir} a directory written by fairseq-clusterformer-qa-binarize?"
        )
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save_config(data_dir: str, config: dict[str, Any]) -> None:
    with atomic_open(os.path.join(data_dir, CONFIG)) as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


class QABinarizedWriter:
    """Writes one split through temporary files of ``files`` (an ``AtomicFiles``): nothing appears until commit."""

    def __init__(self, data_dir: str, split: str, vocab_size: int, files: AtomicFiles) -> None:
        prefix = os.path.join(data_dir, split)
        self._builders = {}
        self._index_paths = {}
        for part in ("question", "context"):
            self._builders[part] = indexed_dataset.make_builder(
                str(files.path(f"{prefix}.{part}.bin")), impl="mmap", vocab_size=vocab_size
            )
            self._index_paths[part] = str(files.path(f"{prefix}.{part}.idx"))
        self._meta = open(files.path(f"{prefix}.meta.jsonl"), "w", encoding="utf-8")
        self._prefix, self._files = prefix, files
        self._texts: ContextTextWriter | None = None  # made by the first example that carries offsets
        self.count = 0

    def add(self, example: EncodedExample) -> None:
        meta = example.meta
        if example.offsets is not None:
            if self._texts is None:
                self._texts = ContextTextWriter(self._prefix, self._files)
            meta = {**meta, TEXT_INDEX: self._texts.add(example.paragraphs, example.offsets)}
        self._builders["question"].add_item(torch.from_numpy(example.question))
        self._builders["context"].add_item(torch.from_numpy(example.context))
        self._meta.write(json.dumps(meta, ensure_ascii=False) + "\n")
        self.count += 1

    def close(self) -> None:
        for part, builder in self._builders.items():
            builder.finalize(self._index_paths[part])
        self._meta.close()
        if self._texts is not None:
            self._texts.close()


@dataclass
class QAExample:
    question: torch.Tensor  # Q
    context: torch.Tensor  # N
    meta: dict[str, Any]


class QABinarizedSplit:
    """Read one split of a binarised QA directory: ``split[i]`` is a ``QAExample``."""

    def __init__(self, data_dir: str, split: str) -> None:
        self.data_dir, self.split = data_dir, split
        self.config = load_config(data_dir)
        self.dictionary = Dictionary.load(os.path.join(data_dir, "dict.txt"))
        self.paragraph_id = self.dictionary.index(self.config.get("paragraph_token", PARAGRAPH_TOKEN))
        prefix = os.path.join(data_dir, split)
        self.questions = self._open(f"{prefix}.question")
        self.contexts = self._open(f"{prefix}.context")
        with open(f"{prefix}.meta.jsonl", encoding="utf-8") as f:
            self.metas = [json.loads(line) for line in f]
        if not len(self.questions) == len(self.contexts) == len(self.metas):
            raise ValueError(
                f"{prefix}.*: {len(self.questions)} questions, {len(self.contexts)} contexts and {len(self.metas)} "
                "meta lines; the split is incomplete, binarise it again"
            )
        self._tokenizer = None
        # the original text behind the contexts, where the ids cannot give it back
        self.texts = ContextTexts(prefix) if self.config.get("tokenizer") == "hf" else None

    @staticmethod
    def _open(prefix: str) -> indexed_dataset.MMapIndexedDataset:
        if not indexed_dataset.MMapIndexedDataset.exists(prefix):
            raise FileNotFoundError(f"{prefix}.bin / .idx not found: binarise this split first")
        return indexed_dataset.MMapIndexedDataset(prefix)

    def __len__(self) -> int:
        return len(self.metas)

    def __getitem__(self, i: int) -> QAExample:
        return QAExample(self.questions[i].long(), self.contexts[i].long(), self.metas[i])

    @property
    def question_sizes(self) -> np.ndarray:
        return self.questions.sizes

    @property
    def context_sizes(self) -> np.ndarray:
        return self.contexts.sizes

    @property
    def tokenizer(self):
        """The tokeniser the split was written with (built on first use: GPT-2 BPE takes a second to load)."""
        if self._tokenizer is None:
            self._tokenizer = build_tokenizer(located(self.config, self.data_dir), self.dictionary)
        return self._tokenizer

    def context_offsets(self, i: int) -> torch.Tensor:
        """N x 3 (paragraph, first character, end character) of every context token of example ``i`` (only for a
        tokeniser that is not lossless)."""
        if self.texts is None:
            raise ValueError(f"{self.data_dir}/{self.split}: its tokeniser is lossless; no offsets are stored")
        return self.texts.offsets(self.metas[i][TEXT_INDEX])

    def span_text(self, i: int, start: int, end: int, offsets: torch.Tensor | None = None) -> str:
        """Answer text of the inclusive context token span ``[start, end]`` of example ``i``. ``offsets`` (not lossless
        tokenisers): those of the context as the model read it, if a cut moved its tokens."""
        if self.texts is None:
            return span_text(self.tokenizer, self.contexts[i], start, end)
        offsets = self.context_offsets(i) if offsets is None else offsets
        return span_text_from_offsets(self.texts.paragraphs(self.metas[i][TEXT_INDEX]), offsets, start, end)


def span_text(tokenizer, context: Any, start: int, end: int) -> str:
    """Text of the inclusive token span ``[start, end]`` of a context (paragraph tokens left out), spaces stripped.

    Both tokenisers are lossless, so the span's bytes are the original context's bytes; a byte-level token may hold
    part of a multi-byte character, so the span grows to the whole characters it touches (never a U+FFFD that is not
    in the context). With the natural tokenisation of an evaluation split that is the text a prediction scores with.
    """
    context = np.asarray(context)
    # a character has at most 3 more bytes and every token at least one, so 3 tokens either side complete it
    before = tokenizer.decode_bytes(context[max(0, start - 3) : start])
    after = tokenizer.decode_bytes(context[end + 1 : end + 4])
    body = whole_characters(before, tokenizer.decode_bytes(context[start : end + 1]), after)
    return body.decode("utf-8", errors="replace").strip()


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def whole_characters(before: bytes, body: bytes, after: bytes) -> bytes:
    """``body`` grown into ``before`` / ``after`` (the bytes around it) until it starts and ends on UTF-8 characters."""
    if body and _is_continuation(body[0]):
        lead = len(before)
        while lead > 0 and _is_continuation(before[lead - 1]):
            lead -= 1
        body = before[max(lead - 1, 0) :] + body
    last = len(body) - 1
    while last > 0 and _is_continuation(body[last]):
        last -= 1
    if last >= 0 and not _is_continuation(body[last]):
        first = body[last]
        width = 1 if first < 0x80 else 2 if first < 0xE0 else 3 if first < 0xF0 else 4
        missing = last + width - len(body)
        if missing > 0:
            body += after[:missing]
    return body


def span_in_paragraph(
    tokenizer, context: Any, paragraph_starts: list[int], start: int, end: int
) -> tuple[int, int, int] | None:
    """Where the inclusive token span ``[start, end]`` lies in its paragraph's text: (paragraph, byte start, byte end).

    A span that runs into the next paragraph is cut at its own paragraph's end; offsets are in the paragraph's UTF-8
    bytes with surrounding whitespace left out. None if the span holds no text.
    """
    context = np.asarray(context)
    p = int(np.searchsorted(paragraph_starts, start, side="right")) - 1
    if p < 0:
        return None
    first_token = paragraph_starts[p] + 1
    stop = paragraph_starts[p + 1] if p + 1 < len(paragraph_starts) else len(context)
    start, end = max(start, first_token), min(end, stop - 1)
    if end < start:
        return None
    prefix = len(tokenizer.decode_bytes(context[first_token:start]))
    text = tokenizer.decode_bytes(context[start : end + 1])
    lead = len(text) - len(text.lstrip())
    body = len(text.strip())
    if body == 0:
        return None
    return p, prefix + lead, prefix + lead + body
