"""Tokenisers for QA data, working in fairseq dictionary ids and reporting how many bytes of text each token covers.

N = tokens of one text.

The first two tokenisers are lossless on the text they accept (``lossless = True``): the bytes of the tokens,
concatenated, are exactly the UTF-8 bytes of the text. That is what lets the binariser map character spans to token
spans exactly (``qa_spans.py``) and turn a predicted token span back into the very characters of the context.

- ``GPT2BPETokenizer``: GPT-2 byte-level BPE from local ``encoder.json`` / ``vocab.bpe`` files (fairseq's own
  encoder), ids mapped through fairseq's GPT-2 ``dict.txt``, exactly as fairseq's RoBERTa checkpoints expect.
- ``SentencePieceTokenizer``: a model trained by ``fairseq-clusterformer-train-spm`` (identity normalisation, no dummy
  prefix, byte fallback, so that it is lossless); pieces are the dictionary symbols.
- ``HFTokenizer`` (``qa_hf_tokenizer.py``): the tokeniser of a Hugging Face encoder imported with
  ``fairseq-clusterformer-import-hf``; not lossless (uncased WordPiece), so it reports character offsets instead.
Nothing is ever downloaded.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from fairseq.data import Dictionary

from fairseq_clusterformer.qa.data.hf_tokenizer import HFTokenizer
from fairseq_clusterformer.qa.data.records import RecordError

PARAGRAPH_TOKEN = "<p>"


def add_paragraph_token(dictionary: Dictionary) -> int:
    """Index of the paragraph symbol, appended at the end of the dictionary if it is not there yet."""
    if PARAGRAPH_TOKEN not in dictionary.indices:
        dictionary.add_symbol(PARAGRAPH_TOKEN)
    return dictionary.index(PARAGRAPH_TOKEN)


class GPT2BPETokenizer:
    name = "gpt2"
    lossless = True

    def __init__(self, encoder_json: str, vocab_bpe: str, dictionary: Dictionary) -> None:
        from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

        for flag, path in (("--encoder-json", encoder_json), ("--vocab-bpe", vocab_bpe)):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{flag}: no such file {path}")
        self.encoder_json, self.vocab_bpe = os.path.abspath(encoder_json), os.path.abspath(vocab_bpe)
        self.bpe = get_encoder(encoder_json, vocab_bpe)
        self.dictionary = dictionary
        # fairseq's GPT-2 dict.txt lists the BPE ids as strings, in frequency order: two lookup tables, one per way.
        self.to_dict = np.array([dictionary.index(str(i)) for i in range(len(self.bpe.encoder))], dtype=np.int64)
        self.from_dict = np.full(len(dictionary), -1, dtype=np.int64)
        self.from_dict[self.to_dict] = np.arange(len(self.to_dict))
        self.from_dict[dictionary.unk()] = -1

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Dictionary ids (N) and the number of UTF-8 bytes each token covers (N)."""
        ids: list[int] = []
        lengths: list[int] = []
        for word in self.bpe.re.findall(self.bpe.pat, text):
            # one byte-encoder character per UTF-8 byte, so a BPE piece's length is its byte count
            chars = "".join(self.bpe.byte_encoder[b] for b in word.encode("utf-8"))
            for piece in self.bpe.bpe(chars).split(" "):
                ids.append(self.bpe.encoder[piece])
                lengths.append(len(piece))
        return self.to_dict[np.array(ids, dtype=np.int64)], np.array(lengths, dtype=np.int64)

    def decode_bytes(self, ids: Any) -> bytes:
        """UTF-8 bytes of dictionary ids; symbols that are not BPE tokens (``<p>``, ``<s>``, ...) are left out."""
        bpe_ids = self.from_dict[np.asarray(ids, dtype=np.int64).reshape(-1)]
        chars = "".join(self.bpe.decoder[int(i)] for i in bpe_ids if i >= 0)
        return bytes(self.bpe.byte_decoder[c] for c in chars)

    def decode(self, ids: Any) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def config(self) -> dict[str, str]:
        return {"tokenizer": self.name, "encoder_json": self.encoder_json, "vocab_bpe": self.vocab_bpe}


def sentencepiece_dictionary(model_path: str) -> Dictionary:
    """A fairseq dictionary holding every normal and byte piece of a sentencepiece model (its unknown maps to <unk>)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model_path)
    dictionary = Dictionary()
    for i in range(sp.get_piece_size()):
        if not (sp.is_control(i) or sp.is_unknown(i)):
            dictionary.add_symbol(sp.id_to_piece(i))
    return dictionary


class SentencePieceTokenizer:
    name = "sentencepiece"
    lossless = True

    def __init__(self, model_path: str, dictionary: Dictionary) -> None:
        import sentencepiece as spm

        if not os.path.isfile(model_path):
            raise FileNotFoundError(f"--sentencepiece-model: no such file {model_path}")
        self.model_path = os.path.abspath(model_path)
        self.sp = spm.SentencePieceProcessor(model_file=model_path)
        self.dictionary = dictionary
        size = self.sp.get_piece_size()
        pieces = [self.sp.id_to_piece(i) for i in range(size)]
        self.to_dict = np.array([dictionary.index(p) for p in pieces], dtype=np.int64)
        self.from_dict = np.full(len(dictionary), -1, dtype=np.int64)
        self.from_dict[self.to_dict] = np.arange(size)
        self.from_dict[dictionary.unk()] = -1
        # the bytes of text behind every piece: "\u2581" stands for a space, a byte piece <0xNN> for that one byte
        self.piece_text = [
            bytes([int(p[3:5], 16)]) if self.sp.is_byte(i) else p.replace("\u2581", " ").encode("utf-8")
            for i, p in enumerate(pieces)
        ]
        for i in range(size):
            if self.sp.is_control(i) or self.sp.is_unknown(i):
                self.piece_text[i] = b""
        self.piece_bytes = np.array([len(t) for t in self.piece_text], dtype=np.int64)

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Dictionary ids (N) and the number of UTF-8 bytes each token covers (N)."""
        sp_ids = np.array(self.sp.encode(text), dtype=np.int64)
        lengths = self.piece_bytes[sp_ids]
        if int(lengths.sum()) != len(text.encode("utf-8")):
            raise RecordError(
                "untokenizable",
                f"the sentencepiece model {self.model_path} does not reproduce this text exactly (unknown characters, "
                "normalisation or a literal '\u2581'); train one with fairseq-clusterformer-train-spm",
            )
        return self.to_dict[sp_ids], lengths

    def decode_bytes(self, ids: Any) -> bytes:
        """UTF-8 bytes of dictionary ids; symbols that are not pieces (``<p>``, ``<s>``, ...) are left out."""
        sp_ids = self.from_dict[np.asarray(ids, dtype=np.int64).reshape(-1)]
        return b"".join(self.piece_text[i] for i in sp_ids if i >= 0)

    def decode(self, ids: Any) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def config(self) -> dict[str, str]:
        return {"tokenizer": self.name, "sentencepiece_model": self.model_path}


TOKENIZERS = ("gpt2", "sentencepiece", "hf")
# the files (or, for hf, the folder) a tokeniser is built from, as qa_config.json records them
TOKENIZER_FILES = ("sentencepiece_model", "encoder_json", "vocab_bpe", "hf_dir")


# the files (or, for "hf", the directory) each tokeniser's config records, by its key in qa_config.json
TOKENIZER_FILES = {"gpt2": ("encoder_json", "vocab_bpe"), "sentencepiece": ("sentencepiece_model",), "hf": ("hf_dir",)}
HF_DIR_FILES = ("tokenizer.json", "hf_import.json")


def locate_tokenizer_files(config: dict[str, str], folders: list[str]) -> dict[str, str]:
    """``config`` (a ``qa_config.json``) with every tokeniser file found on this machine: where it records it, else
    under the same name in one of ``folders`` (the data folder first, then e.g. the checkpoint's folder), where a copied
    or downloaded model keeps it, or in the folder of the recorded name beside one of them (``prepare_common.sh``'s
    ``OUT/bin`` and ``OUT/spm``); the paths it records are those of the machine that binarised the data. For "hf" a
    folder holding the import's files directly counts too. FileNotFoundError names the config, the key and every
    place tried."""
    found = dict(config)
    for key in TOKENIZER_FILES.get(config.get("tokenizer"), ()):
        recorded = str(config.get(key) or "").rstrip("/")
        is_dir = key == "hf_dir"
        name, recorded_folder = os.path.basename(recorded), os.path.basename(os.path.dirname(recorded))
        tried = [recorded] if recorded else []
        for folder in folders:
            if recorded:
                tried.append(os.path.join(folder, name))
                tried.append(os.path.join(os.path.dirname(os.path.abspath(folder)), recorded_folder, name))
            tried += [folder] if is_dir else []
        usable = [p for p in tried if (_holds_hf_files(p) if is_dir else os.path.isfile(p))]
        if not usable:
            where = os.path.join(folders[0], "qa_config.json") if folders else "qa_config.json"
            raise FileNotFoundError(
                f"{where} records the {config.get('tokenizer')} tokeniser's {key} as {recorded!r}, not on this "
                f"machine (the data folder was made on another machine or moved?); looked at "
                f"{', '.join(dict.fromkeys(tried))}: copy it into the data folder"
            )
        found[key] = usable[0]
    return found


def _holds_hf_files(path: str) -> bool:
    return os.path.isdir(path) and all(os.path.isfile(os.path.join(path, name)) for name in HF_DIR_FILES)


def build_tokenizer(
    config: dict[str, str], dictionary: Dictionary
) -> GPT2BPETokenizer | SentencePieceTokenizer | HFTokenizer:
    """The tokeniser a ``qa_config.json`` (or the binariser's flags, in the same shape) names."""
    if config["tokenizer"] == "gpt2":
        return GPT2BPETokenizer(config["encoder_json"], config["vocab_bpe"], dictionary)
    if config["tokenizer"] == "sentencepiece":
        return SentencePieceTokenizer(config["sentencepiece_model"], dictionary)
    if config["tokenizer"] == "hf":
        return HFTokenizer(config["hf_dir"], dictionary)
    raise ValueError(
        f"--tokenizer: unknown tokenizer {config['tokenizer']!r} (expected one of {', '.join(TOKENIZERS)})"
    )
