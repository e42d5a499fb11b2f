"""The tokeniser of a Hugging Face encoder imported with ``fairseq-clusterformer-import-hf``, for QA data.

N = tokens of one text.

An imported directory holds ``tokenizer.json`` (the source model's fast tokeniser), ``dict.txt`` (one fairseq symbol
per Hugging Face id, written as the id in decimal, the special tokens excepted) and ``hf_import.json``, whose
``special_tokens`` maps each fairseq special (``<s>``, ``</s>``, ``<pad>``, ``<unk>``, ``<mask>``) to the source
token and id it stands for (BERT: ``[CLS] -> <s>``, ``[SEP] -> </s>``, ...). Text is tokenised by the ``tokenizers``
library exactly as the source model does (no special tokens added: the QA model adds them around the question),
and every Hugging Face id is mapped to its fairseq id.

Unlike GPT-2 BPE and the project's sentencepiece models, such a tokeniser need not be lossless: BERT's uncased
WordPiece lower-cases, strips accents and drops whitespace, so the text cannot be rebuilt from the ids. Spans are
therefore mapped through the character offsets the tokeniser reports for every token (``lossless = False``): a gold
answer becomes the tokens that cover its characters, and a predicted token span becomes the original context's
characters from its first token's start to its last token's end (``qa/data/binarized.py`` stores the offsets).
"""

from __future__ import annotations

import json
import os

import numpy as np
from fairseq.data import Dictionary

from fairseq_clusterformer.qa.data.records import RecordError

IMPORT_FILES = ("tokenizer.json", "dict.txt", "hf_import.json")


def check_hf_dir(hf_dir: str, flag: str = "--hf-dir") -> str:
    """``hf_dir`` as an absolute path, after checking that it holds the files an import writes."""
    if not os.path.isdir(hf_dir):
        raise FileNotFoundError(f"{flag}: no such directory {hf_dir}")
    for name in IMPORT_FILES:
        if not os.path.isfile(os.path.join(hf_dir, name)):
            raise FileNotFoundError(
                f"{flag} {hf_dir} holds no {name}: give a directory written by fairseq-clusterformer-import-hf"
            )
    return os.path.abspath(hf_dir)


def hf_dictionary(hf_dir: str) -> Dictionary:
    """The fairseq dictionary of an imported model (its ``dict.txt``)."""
    return Dictionary.load(os.path.join(check_hf_dir(hf_dir), "dict.txt"))


def load_import_info(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "hf_import.json")
    with open(path, encoding="utf-8") as f:
        info = json.load(f)
    specials = info.get("special_tokens")
    if not isinstance(specials, dict) or not all(isinstance(v, list) and len(v) == 2 for v in specials.values()):
        raise ValueError(f"{path}: 'special_tokens' must map each fairseq symbol to [hf_token, hf_id]")
    return info


class HFTokenizer:
    name = "hf"
    lossless = False

    def __init__(self, hf_dir: str, dictionary: Dictionary) -> None:
        from tokenizers import Tokenizer

        self.hf_dir = check_hf_dir(hf_dir)
        self.info = load_import_info(self.hf_dir)
        self.tokenizer = Tokenizer.from_file(os.path.join(self.hf_dir, "tokenizer.json"))
        # a saved tokenizer.json may carry the source's batching settings (all-MiniLM-L6-v2: truncation and padding
        # to 128 tokens); a context of thousands of tokens must come out whole and unpadded
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.dictionary = dictionary
        size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        # Hugging Face id -> fairseq id; -1 for an id the dictionary does not hold
        self.to_dict = np.full(size, -1, dtype=np.int64)
        for index, symbol in enumerate(dictionary.symbols):
            if symbol.isdigit() and int(symbol) < size:
                self.to_dict[int(symbol)] = index
        for symbol, (token, hf_id) in self.info["special_tokens"].items():
            if symbol in dictionary.indices and 0 <= int(hf_id) < size:
                self.to_dict[int(hf_id)] = dictionary.index(symbol)
        self.from_dict = np.full(len(dictionary), -1, dtype=np.int64)  # fairseq id -> Hugging Face id, -1: none
        mapped = np.flatnonzero(self.to_dict >= 0)
        self.from_dict[self.to_dict[mapped]] = mapped
        specials = {int(hf_id) for _, hf_id in self.info["special_tokens"].values()}
        missing = [i for i in np.flatnonzero(self.to_dict < 0).tolist() if i not in specials]
        if missing:
            raise ValueError(
                f"{self.hf_dir}: dict.txt has no symbol for {len(missing)} of the tokenizer's {size} ids (e.g. "
                f"{missing[:5]}): was it written by fairseq-clusterformer-import-hf from this tokenizer.json?"
            )

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Dictionary ids (N) and each token's character span in ``text`` (N x 2, ``[start, end)``)."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        hf_ids = np.array(encoding.ids, dtype=np.int64)
        ids = self.to_dict[hf_ids]
        if np.any(ids < 0):
            token = encoding.tokens[int(np.flatnonzero(ids < 0)[0])]
            raise RecordError(
                "untokenizable",
                f"the text holds {token!r}, a special token of {self.hf_dir}/tokenizer.json that dict.txt does not map",
            )
        offsets = np.array(encoding.offsets, dtype=np.int64).reshape(len(ids), 2)  # N x 2
        return ids, offsets

    def hf_ids(self, ids) -> list[int]:
        """The Hugging Face ids of dictionary ids (those that stand for one)."""
        hf = self.from_dict[np.asarray(ids, dtype=np.int64).reshape(-1)]
        return hf[hf >= 0].tolist()

    def decode(self, ids) -> str:
        """Normalised text of dictionary ids, for reading only (answers are cut from the original text instead)."""
        return self.tokenizer.decode(self.hf_ids(ids))

    def config(self) -> dict[str, str]:
        return {"tokenizer": self.name, "hf_dir": self.hf_dir}
