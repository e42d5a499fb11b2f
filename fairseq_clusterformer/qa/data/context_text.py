"""The original text behind the contexts of a split tokenised by a tokeniser that is not lossless (``HFTokenizer``).

N = context tokens.

Uncased WordPiece cannot give the answer text back from ids (it lower-cased, stripped accents, dropped spaces), so
the binariser keeps, once per distinct context (every question of a SQuAD article shares one), its paragraphs and
the character span of every context token:
  {split}.offsets.{bin,idx}   fairseq mmap indexed dataset, item k = N x 3 int32 flattened: per context token its
                              paragraph, first character and end character in that paragraph (-1 -1 for <p>)
  {split}.texts.jsonl         line k: the paragraphs of context k (a JSON list of strings)
and every meta line names its context's k as ``text_index``. A predicted span's text is then the paragraph's
characters from its first token's start to its last token's end (``span_text_from_offsets``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict

import numpy as np
import torch
from fairseq.data import indexed_dataset

from fairseq_clusterformer.atomic_files import AtomicFiles

TEXT_INDEX = "text_index"


class ContextTextWriter:
    """Writes the offsets and paragraphs of each distinct context of one split through ``files``."""

    def __init__(self, prefix: str, files: AtomicFiles) -> None:
        self._builder = indexed_dataset.MMapIndexedDatasetBuilder(str(files.path(f"{prefix}.offsets.bin")), np.int32)
        self._index_path = str(files.path(f"{prefix}.offsets.idx"))
        self._texts = open(files.path(f"{prefix}.texts.jsonl"), "w", encoding="utf-8")
        self._seen: dict[str, int] = {}

    def add(self, paragraphs: list[str], offsets: np.ndarray) -> int:
        """Index of the context with these paragraphs and N x 3 token ``offsets``, written the first time it is seen."""
        text = json.dumps(paragraphs, ensure_ascii=False)
        key = hashlib.sha1(f"{len(offsets)}\n{text}".encode()).hexdigest()
        if key not in self._seen:
            self._seen[key] = len(self._seen)
            self._builder.add_item(torch.from_numpy(np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)))
            self._texts.write(text + "\n")
        return self._seen[key]

    def close(self) -> None:
        self._builder.finalize(self._index_path)
        self._texts.close()


class ContextTexts:
    """Read side: ``offsets(k)`` (N x 3 LongTensor) and ``paragraphs(k)`` of a split's context ``k``."""

    def __init__(self, prefix: str, cache_size: int = 64) -> None:
        if not indexed_dataset.MMapIndexedDataset.exists(f"{prefix}.offsets"):
            raise FileNotFoundError(
                f"{prefix}.offsets.bin / .idx not found: a split of a tokeniser that is not lossless needs them; "
                "binarise it again"
            )
        self._offsets = indexed_dataset.MMapIndexedDataset(f"{prefix}.offsets")
        self._path = f"{prefix}.texts.jsonl"
        # byte position of every line, so that one context is read without loading the others
        self._lines = [0]
        with open(self._path, "rb") as f:
            for line in f:
                self._lines.append(self._lines[-1] + len(line))
        self._lines.pop()
        if len(self._lines) != len(self._offsets):
            raise ValueError(f"{self._path}: {len(self._lines)} lines for {len(self._offsets)} offset items")
        self._cache: OrderedDict[int, list[str]] = OrderedDict()
        self._cache_size = cache_size

    def offsets(self, k: int) -> torch.Tensor:
        return self._offsets[k].long().reshape(-1, 3)  # N x 3

    def paragraphs(self, k: int) -> list[str]:
        if k not in self._cache:
            with open(self._path, "rb") as f:
                f.seek(self._lines[k])
                self._cache[k] = json.loads(f.readline())
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return self._cache[k]


def span_text_from_offsets(paragraphs: list[str], offsets, start: int, end: int) -> str:
    """Text of the inclusive token span ``[start, end]`` (N x 3 ``offsets`` of the context the model read): the
    characters of the first token's paragraph from the first token's start to the end of the span's last token in
    that paragraph, outer whitespace stripped; "" if the span holds no text token."""
    rows = np.asarray(offsets)[max(start, 0) : end + 1]  # n x 3
    rows = rows[rows[:, 1] >= 0]  # paragraph tokens hold no text
    if len(rows) == 0:
        return ""
    paragraph = int(rows[0, 0])
    rows = rows[rows[:, 0] == paragraph]
    return paragraphs[paragraph][int(rows[0, 1]) : int(rows[:, 2].max())].strip()


def has_context_texts(data_dir: str, split: str) -> bool:
    return os.path.isfile(os.path.join(data_dir, f"{split}.texts.jsonl"))
