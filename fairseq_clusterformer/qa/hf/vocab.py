"""The vocabulary side of a Hugging Face import: the source's tokenizer, its special tokens, fairseq's row order.

V = vocabulary rows.

The imported dictionary names every token by its HF id as a decimal string (as fairseq's GPT-2 ``dict.txt`` names
BPE ids), so the QA pipeline tokenises with the source's own ``tokenizer.json`` and looks the ids up. The source's
special tokens take fairseq's built-in places: ``[CLS]``/``<s>`` -> ``<s>``, ``[PAD]``/``<pad>`` -> ``<pad>``,
``[SEP]``/``</s>`` -> ``</s>``, ``[UNK]``/``<unk>`` -> ``<unk>`` (fairseq's indices 0-3) and ``[MASK]``/``<mask>``
-> ``<mask>``, which fairseq's masked-LM task appends after the dictionary, so its row goes last.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from fairseq_clusterformer.qa.hf.weights import HFImportError

# fairseq symbol -> the tokenizer_config.json field that names the source's token, in fairseq's index order
FAIRSEQ_SPECIALS = {"<s>": "cls_token", "<pad>": "pad_token", "</s>": "sep_token", "<unk>": "unk_token"}
MASK = ("<mask>", "mask_token")
FIELDS = ("cls_token", "pad_token", "sep_token", "unk_token", "mask_token")
DEFAULT_TOKENS = {
    "bert": dict(zip(FIELDS, ("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"))),
    "roberta": dict(zip(FIELDS, ("<s>", "<pad>", "</s>", "<unk>", "<mask>"))),
}


def tokenizer_settings(src: str) -> dict[str, Any]:
    """tokenizer_config.json with special_tokens_map.json over it (either may be absent); an ``AddedToken``
    written as a dict becomes its text."""
    settings: dict[str, Any] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(src, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                settings.update(json.load(f))
    return {k: v["content"] if isinstance(v, dict) and "content" in v else v for k, v in settings.items()}


def special_tokens(model_type: str, settings: dict[str, Any]) -> dict[str, str]:
    """fairseq symbol -> the source's token text."""
    fields = {**FAIRSEQ_SPECIALS, MASK[0]: MASK[1]}
    return {symbol: str(settings.get(field) or DEFAULT_TOKENS[model_type][field]) for symbol, field in fields.items()}


def tokenizer_file(src: str) -> str:
    """The file the source's vocabulary is read from, for messages."""
    for name in ("tokenizer.json", "vocab.txt", "vocab.json"):
        if os.path.isfile(os.path.join(src, name)):
            return os.path.join(src, name)
    return os.path.join(src, "tokenizer.json")


def build_tokenizer(src: str, model_type: str, settings: dict[str, Any], specials: dict[str, str]) -> Tokenizer:
    """The source's fast tokenizer: its tokenizer.json, or one built the way HF's converters build it from
    vocab.txt (WordPiece) or vocab.json + merges.txt (byte-level BPE) with the source's settings."""
    path = os.path.join(src, "tokenizer.json")
    if os.path.isfile(path):
        tokenizer = Tokenizer.from_file(path)
        # truncation and padding are batch settings of the source's own use (all-MiniLM-L6-v2 truncates at 128):
        # kept, they would cut every long context silently
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return tokenizer
    vocab_txt = os.path.join(src, "vocab.txt")
    vocab_json, merges = os.path.join(src, "vocab.json"), os.path.join(src, "merges.txt")
    cls, sep = specials["<s>"], specials["</s>"]
    if model_type == "bert" and os.path.isfile(vocab_txt):
        tokenizer = Tokenizer(models.WordPiece.from_file(vocab_txt, unk_token=specials["<unk>"]))
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=settings.get("tokenize_chinese_chars", True),
            strip_accents=settings.get("strip_accents"),
            lowercase=settings.get("do_lower_case", True),
        )
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix="##")
        post = processors.BertProcessing(
            (sep, token_id(tokenizer, sep, vocab_txt)), (cls, token_id(tokenizer, cls, vocab_txt))
        )
    elif model_type == "roberta" and os.path.isfile(vocab_json) and os.path.isfile(merges):
        tokenizer = Tokenizer(models.BPE.from_file(vocab_json, merges))
        prefix_space = settings.get("add_prefix_space", False)
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
        tokenizer.decoder = decoders.ByteLevel()
        post = processors.RobertaProcessing(
            (sep, token_id(tokenizer, sep, vocab_json)),
            (cls, token_id(tokenizer, cls, vocab_json)),
            trim_offsets=settings.get("trim_offsets", True),
            add_prefix_space=prefix_space,
        )
    else:
        wanted = "vocab.txt" if model_type == "bert" else "vocab.json and merges.txt"
        raise HFImportError(f"{src}: no tokenizer.json and no {wanted}: the source's tokenizer cannot be rebuilt")
    tokenizer.post_processor = post
    # the specials are whole tokens that the normaliser must not touch (HF's converters add them the same way)
    tokenizer.add_special_tokens([AddedToken(t, normalized=False) for t in specials.values()])
    return tokenizer


def token_id(tokenizer: Tokenizer, token: str, file: str) -> int:
    index = tokenizer.token_to_id(token)
    if index is None:
        raise HFImportError(f"{file}: the vocabulary has no special token {token!r}")
    return index


def lower_cases(tokenizer: Tokenizer, settings: dict[str, Any]) -> bool:
    """Whether the tokenizer lower-cases: tokenizer_config.json's do_lower_case, else its normaliser."""
    if "do_lower_case" in settings:
        return bool(settings["do_lower_case"])

    def lowers(node: Any) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "Lowercase" or (node.get("type") == "BertNormalizer" and node.get("lowercase")):
                return True
            return any(lowers(v) for v in node.values())
        return isinstance(node, list) and any(lowers(v) for v in node)

    return lowers(json.loads(tokenizer.to_str()).get("normalizer"))


def special_ids(tokenizer: Tokenizer, specials: dict[str, str], file: str) -> dict[str, int]:
    """fairseq symbol -> the source's id of its token; two roles may not share one token."""
    ids = {symbol: token_id(tokenizer, token, file) for symbol, token in specials.items()}
    if len(set(ids.values())) != len(ids):
        raise HFImportError(f"{file}: special tokens share ids ({ids}); each fairseq special needs its own row")
    return ids


def fairseq_order(vocab_size: int, ids: dict[str, int], file: str) -> list[int]:
    """HF id of every fairseq dictionary index: ``<s> <pad> </s> <unk>``, the other ids ascending, ``<mask>``."""
    if max(ids.values()) >= vocab_size:
        raise HFImportError(f"{file}: special token ids {ids} reach past vocab_size {vocab_size} of config.json")
    front = [ids[symbol] for symbol in FAIRSEQ_SPECIALS]
    taken = set(ids.values())
    return [*front, *(i for i in range(vocab_size) if i not in taken), ids[MASK[0]]]


def check_vocab_size(tokenizer: Tokenizer, vocab_size: int, file: str) -> None:
    largest = max(tokenizer.get_vocab(with_added_tokens=True).values())
    if largest >= vocab_size:
        raise HFImportError(f"{file}: token id {largest} has no embedding row (config.json vocab_size {vocab_size})")


def dictionary_lines(order: list[int]) -> list[str]:
    """dict.txt: every id but the five specials, as ``SYMBOL COUNT`` (fairseq adds its own specials)."""
    return [f"{hf_id} 1\n" for hf_id in order[len(FAIRSEQ_SPECIALS) : -1]]
