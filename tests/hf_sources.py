"""Tiny random Hugging Face BERT and RoBERTa model directories, made locally (no download), for the import tests.

Every parameter is drawn at a scale where a wrong mapping (a transposed matrix, a swapped layer norm, rows off by
one) moves the hidden states by far more than the tolerance; the special tokens sit at other ids than fairseq's
0-3, so the embedding rows must be reordered.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch


def import_transformers():
    """transformers, with a torchaudio that cannot load hidden: fairseq installs one built for another torch, and
    transformers imports it whenever it is installed."""
    try:
        import torchaudio  # noqa: F401
    except (ImportError, OSError):
        sys.modules["torchaudio"] = None  # importlib then reports it absent
    transformers = pytest.importorskip("transformers")
    # the Python 3.10 environment's torch 2.0 is older than any transformers release for it supports: it then offers
    # tokenizers and configs only, and the reference models are not there to compare with
    if not transformers.utils.is_torch_available():
        pytest.skip(f"transformers {transformers.__version__} does not support torch {torch.__version__}")
    return transformers


SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
WORDS = "the who wrote play hamlet paris is capital of france what when where did normans give their name to a".split()
SENTENCES = [
    "Who wrote the play Hamlet? William Shakespeare wrote it between 1599 and 1601.",
    "Paris is the capital of France, with about 2,102,650 residents.",
    "The Normans gave their name to Normandy, a region in France.",
]  # fmt: skip


def bert_vocab() -> list[str]:
    """100 WordPiece entries; [PAD] 0 as in BERT, [UNK] [CLS] [SEP] [MASK] further on (BERT: 100-103)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", *WORDS, "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{c}" for c in letters)]
    vocab += [*"0123456789,.?"]
    return vocab + [f"[unused{i}]" for i in range(100 - len(vocab))]


def randomize(model, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3 + (param == 1).float())  # LN near 1


def make_bert(root: Path) -> Path:
    """A BertModel (2 token types, eps 1e-12, 64 positions) with tokenizer.json (truncating at 16, as
    all-MiniLM-L6-v2's does at 128), vocab.txt and tokenizer_config.json."""
    from tokenizers.implementations import BertWordPieceTokenizer

    transformers = import_transformers()
    src = root / "bert"
    src.mkdir()
    vocab = bert_vocab()
    (src / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    tokenizer = BertWordPieceTokenizer(str(src / "vocab.txt"), lowercase=True)
    tokenizer.enable_truncation(16)
    tokenizer.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}))
    config = transformers.BertConfig(
        vocab_size=len(vocab), max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12, **SIZES
    )
    model = transformers.BertModel(config)
    randomize(model, 0)
    model.save_pretrained(src)
    return src


def make_roberta(root: Path) -> Path:
    """A RobertaModel (1 token type, 64 + 2 positions) with vocab.json + merges.txt only (no tokenizer.json), a
    byte-level BPE trained here whose <mask> is id 4 (roberta-base's is its last id)."""
    from tokenizers.implementations import ByteLevelBPETokenizer

    transformers = import_transformers()
    src = root / "roberta"
    src.mkdir()
    tokenizer = ByteLevelBPETokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer.train_from_iterator(SENTENCES * 4, vocab_size=300, min_frequency=1, special_tokens=specials)
    tokenizer.save_model(str(src))
    config = transformers.RobertaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        max_position_embeddings=66,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **SIZES,
    )
    model = transformers.RobertaModel(config, add_pooling_layer=False)
    randomize(model, 1)
    model.save_pretrained(src)
    return src


def load_reference(src: Path, family: str):
    transformers = import_transformers()
    model_class = transformers.BertModel if family == "bert" else transformers.RobertaModel
    return model_class.from_pretrained(src).eval()
