"""Hugging Face BERT / RoBERTa encoder weights as a fairseq RoBERTa state dict (the QA model's encoder).

V = vocabulary rows, P = position rows, C = channels, F = FFN channels, N = token types.

Both families are the same post-norm transformer as fairseq's RoBERTa: token + token-type + position embeddings,
a layer norm, then layers of (attention, residual, layer norm, FFN, residual, layer norm). What differs is named in
one table (``LAYER_KEYS``, ``EMBEDDING_KEYS``) and three rules:
- rows: fairseq's Dictionary puts ``<s> <pad> </s> <unk>`` at 0-3 and the masked-LM ``<mask>`` last, so the
  embedding rows are reordered (``hf_vocab.fairseq_order``);
- positions: fairseq's learned positions of a sequence are ``padding_idx + 1, padding_idx + 2, ...``; BERT's are
  ``0, 1, ...`` and HF RoBERTa's are ``pad_token_id + 1, ...``, so the rows shift by the difference;
- layer-norm epsilon, token types and activation have no place in a RoBERTa state dict: they go to the encoder
  arguments (``encoder_args``) that ``--roberta-path`` reads from ``hf_import.json``.
Every source tensor is used exactly once or skipped for a stated reason; anything else is an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("bert", "roberta")
# HF hidden_act -> fairseq activation_fn computing the same function (gelu_new is fairseq's gelu_accurate formula)
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_accurate", "relu": "relu"}
FAIRSEQ_PAD = 1  # fairseq's Dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3
ENCODER = "encoder.sentence_encoder."
TOKEN_TYPES_KEY = ENCODER + "embed_token_types.weight"

# HF name inside ``encoder.layer.N.`` -> fairseq name inside ``layers.N.``
LAYER_KEYS = {
    "attention.self.query": "self_attn.q_proj",
    "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj",
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "self_attn_layer_norm",
    "intermediate.dense": "fc1",
    "output.dense": "fc2",
    "output.LayerNorm": "final_layer_norm",
}
EMBEDDING_KEYS = {
    "embeddings.word_embeddings.weight": ENCODER + "embed_tokens.weight",
    "embeddings.position_embeddings.weight": ENCODER + "embed_positions.weight",
    "embeddings.token_type_embeddings.weight": TOKEN_TYPES_KEY,
    "embeddings.LayerNorm.weight": ENCODER + "layernorm_embedding.weight",
    "embeddings.LayerNorm.bias": ENCODER + "layernorm_embedding.bias",
}
# source tensors that are not part of the encoder's function, each with the reason it is not imported
SKIPPED = {
    "pooler.": "the pooler (tanh layer on the first token) serves sentence-level heads; the QA model has its own",
    "cls.": "a pre-training head (masked LM / next sentence); the QA model has its own heads",
    "lm_head.": "the masked-LM head; the QA model has its own heads",
}
LAYER_PATTERN = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")


class HFImportError(ValueError):
    """A source checkpoint that cannot be imported exactly (the message names the file or config field)."""


@dataclass(frozen=True)
class HFConfig:
    """The fields of a HF ``config.json`` that define the encoder's function."""

    path: str
    model_type: str
    layers: int
    channels: int
    heads: int
    ffn: int
    vocab_size: int
    positions: int  # HF max_position_embeddings (rows of the position table)
    types: int
    eps: float
    hidden_act: str
    pad_token_id: int

    @property
    def position_offset(self) -> int:
        """The HF row of a sequence's first position: BERT counts from 0, RoBERTa from its pad id + 1."""
        return self.pad_token_id + 1 if self.model_type == "roberta" else 0

    @property
    def max_positions(self) -> int:
        return self.positions - self.position_offset


def read_config(src: str) -> HFConfig:
    path = os.path.join(src, "config.json")
    if not os.path.isfile(path):
        raise HFImportError(f"{src}: no config.json (a Hugging Face model directory has one)")
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)

    def field(name: str, kind: type = int):
        if name not in raw:
            raise HFImportError(f"{path}: no {name!r} field")
        return kind(raw[name])

    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise HFImportError(f"{path}: model_type {model_type!r} is not supported (supported: {SUPPORTED_MODEL_TYPES})")
    position_type = raw.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise HFImportError(
            f"{path}: position_embedding_type {position_type!r} is not supported: the encoder has learned absolute "
            "positions only (relative or rotary positions would need another attention)"
        )
    if raw.get("is_decoder") or raw.get("add_cross_attention"):
        raise HFImportError(f"{path}: is_decoder / add_cross_attention: only bidirectional encoders are supported")
    hidden_act = field("hidden_act", str)
    if hidden_act not in ACTIVATIONS:
        raise HFImportError(f"{path}: hidden_act {hidden_act!r} is not supported (supported: {sorted(ACTIVATIONS)})")
    config = HFConfig(
        path=path,
        model_type=model_type,
        layers=field("num_hidden_layers"),
        channels=field("hidden_size"),
        heads=field("num_attention_heads"),
        ffn=field("intermediate_size"),
        vocab_size=field("vocab_size"),
        positions=field("max_position_embeddings"),
        types=field("type_vocab_size"),
        eps=field("layer_norm_eps", float),
        hidden_act=hidden_act,
        pad_token_id=int(raw.get("pad_token_id", 1 if model_type == "roberta" else 0)),
    )
    if config.channels % config.heads:
        raise HFImportError(f"{path}: hidden_size {config.channels} is not a multiple of num_attention_heads")
    if config.max_positions < 1:
        raise HFImportError(f"{path}: max_position_embeddings {config.positions} leaves no position after the pad")
    return config


def encoder_args(config: HFConfig) -> dict:
    """The QA model's encoder arguments under which the imported weights compute what the source model does."""
    return {
        "encoder_layers": config.layers,
        "encoder_embed_dim": config.channels,
        "encoder_ffn_embed_dim": config.ffn,
        "encoder_attention_heads": config.heads,
        "activation_fn": ACTIVATIONS[config.hidden_act],
        "max_positions": config.max_positions,
        "layer_norm_eps": config.eps,
        "type_vocab_size": config.types,
        "encoder_normalize_before": False,
        "layernorm_embedding": True,
        "no_scale_embedding": True,
        "encoder_learned_pos": True,
    }


def weights_file(src: str) -> str:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.isfile(os.path.join(src, name)):
            return os.path.join(src, name)
    raise HFImportError(
        f"{src}: no model.safetensors or pytorch_model.bin (sharded checkpoints, *.index.json, are not supported)"
    )


def read_weights(file: str) -> dict[str, Tensor]:
    # a download cut short fails deep in either reader with a message that names no file (safetensors: "incomplete
    # metadata, file not fully covered"; torch: "[Errno 22] Invalid argument")
    try:
        if file.endswith(".safetensors"):
            return load_file(file)
        return torch.load(file, map_location="cpu", weights_only=True)
    except PermissionError:
        raise  # not a damaged file: the console script names it with its reason
    except (SafetensorError, RuntimeError, OSError, EOFError, pickle.UnpicklingError) as error:
        raise HFImportError(
            f"{file}: cannot be read ({error}): the file is truncated or corrupt; copy or download it again"
        ) from error


def sha256(file: str) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def expected_shapes(config: HFConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every source tensor the encoder needs, from the config alone."""
    c, f = config.channels, config.ffn
    shapes = {
        "embeddings.word_embeddings.weight": (config.vocab_size, c),
        "embeddings.position_embeddings.weight": (config.positions, c),
        "embeddings.token_type_embeddings.weight": (config.types, c),
        "embeddings.LayerNorm.weight": (c,),
        "embeddings.LayerNorm.bias": (c,),
    }
    linear = {"intermediate.dense": (f, c), "output.dense": (c, f)}  # out x in; the attention's are C x C
    for i in range(config.layers):
        for name in LAYER_KEYS:
            weight = (c,) if "LayerNorm" in name else linear.get(name, (c, c))
            shapes[f"encoder.layer.{i}.{name}.weight"] = weight
            shapes[f"encoder.layer.{i}.{name}.bias"] = weight[:1]
    return shapes


def source_keys(weights: dict[str, Tensor], config: HFConfig) -> dict[str, Tensor]:
    """Keys as ``BertModel`` / ``RobertaModel`` name them: a task model's ``bert.`` / ``roberta.`` prefix off,
    the TF-era ``LayerNorm.gamma`` / ``beta`` spelt ``weight`` / ``bias`` (as HF's own loader renames them)."""
    prefix = config.model_type + "."
    out = {}
    for key, tensor in weights.items():
        key = key[len(prefix) :] if key.startswith(prefix) else key
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
        if key in out:
            raise HFImportError(f"two source tensors are named {key!r} once the {prefix!r} prefix is removed")
        out[key] = tensor
    return out


def check_buffer(source: dict[str, Tensor], key: str, expected: Tensor, file: str) -> str | None:
    """HF saves some index buffers beside the weights; they must hold what the encoder assumes."""
    buffer = source.pop(key, None)
    if buffer is None:
        return None
    if buffer.numel() != expected.numel() or not torch.equal(buffer.flatten().long(), expected):
        raise HFImportError(f"{file}: buffer {key} is not {expected[:4].tolist()}...; positions would differ")
    return "an index buffer, checked to hold the default ids the encoder also uses"


def convert_weights(
    weights: dict[str, Tensor], config: HFConfig, order: list[int], file: str
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """(fairseq state dict of the encoder, {skipped source key: reason}). ``order[i]`` is the HF id of fairseq
    dictionary index i (a permutation of all vocab_size ids)."""
    source = source_keys(weights, config)
    skipped = {}
    for key in list(source):
        reason = next((why for prefix, why in SKIPPED.items() if key.startswith(prefix)), None)
        if reason is not None:
            skipped[key] = reason
            del source[key]
    buffers = {
        "embeddings.position_ids": torch.arange(config.positions),
        "embeddings.token_type_ids": torch.zeros(config.positions, dtype=torch.long),
    }
    for key, expected in buffers.items():
        reason = check_buffer(source, key, expected, file)
        if reason is not None:
            skipped[key] = reason
    shapes = expected_shapes(config)
    missing, extra = sorted(set(shapes) - set(source)), sorted(set(source) - set(shapes))
    if missing or extra:
        raise HFImportError(
            f"{file} does not hold exactly the {config.model_type} encoder that {config.path} describes: "
            f"missing {missing[:8]} ({len(missing)}), not mapped {extra[:8]} ({len(extra)})"
        )
    for key, shape in shapes.items():
        if tuple(source[key].shape) != shape:
            raise HFImportError(
                f"{file}: {key} has shape {tuple(source[key].shape)}, but {config.path} implies {shape} "
                "(hidden_size, intermediate_size, vocab_size, max_position_embeddings, type_vocab_size)"
            )
    if sorted(order) != list(range(config.vocab_size)):
        raise HFImportError(f"the vocabulary order does not cover the {config.vocab_size} embedding rows exactly")

    state = {}
    for key, tensor in source.items():
        match = LAYER_PATTERN.match(key)
        if match:
            layer, name, kind = match.groups()
            state[f"{ENCODER}layers.{layer}.{LAYER_KEYS[name]}.{kind}"] = tensor.float()
        else:
            state[EMBEDDING_KEYS[key]] = tensor.float()
    words = state[EMBEDDING_KEYS["embeddings.word_embeddings.weight"]]
    state[EMBEDDING_KEYS["embeddings.word_embeddings.weight"]] = words[torch.tensor(order)]  # V x C, fairseq order
    # fairseq reads row padding_idx + 1 + i for the i-th token (pads read row padding_idx); the HF model reads
    # row offset + i. Rows below padding_idx + 1 are never read: zeros. HF RoBERTa's rows below its offset are
    # never read by HF either, so nothing that computes anything is dropped.
    hf_rows = state[EMBEDDING_KEYS["embeddings.position_embeddings.weight"]]
    rows = hf_rows.new_zeros(FAIRSEQ_PAD + 1 + config.max_positions, config.channels)  # (pad + 1 + P') x C
    rows[FAIRSEQ_PAD + 1 :] = hf_rows[config.position_offset :]
    state[EMBEDDING_KEYS["embeddings.position_embeddings.weight"]] = rows
    # fairseq's encoder version: 3 keeps its upgrade from rewriting the (absent) final layer norm
    state[ENCODER + "version"] = torch.Tensor([3])
    for key, reason in skipped.items():
        logger.info(f"not imported: {key}: {reason}")
    return state, skipped
