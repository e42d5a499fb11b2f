"""Loading a pretrained fairseq RoBERTa checkpoint into the QA model.

V = vocabulary rows, C = channels.

- The published checkpoints (roberta.base / roberta.large) store their options as an ``argparse.Namespace``.
  PyTorch >= 2.6 unpickles with ``weights_only=True`` by default and refuses that class, and fairseq 0.12's
  ``load_checkpoint_to_cpu`` calls plain ``torch.load``. ``argparse.Namespace`` is a plain attribute bag, so it
  is added to torch's allow-list (``add_safe_globals``) when this module is imported: fairseq's own loader,
  ``--restore-file`` included, then reads them with the safe unpickler still on.
- A RoBERTa state dict has an LM head and no QA heads or centroids: ``adapt_roberta_state`` drops the first,
  takes the others from the freshly built model, and matches embedding rows by dictionary symbol.
- A Hugging Face encoder imported by ``fairseq-clusterformer-import-hf`` is such a directory plus
  ``hf_import.json``, whose ``encoder_args`` (sizes, activation, positions, layer-norm epsilon, token types) are
  what make its weights compute the source model's function: ``imported_encoder_args`` gives them to the
  architecture as defaults, and ``check_imported_args`` refuses flags that contradict them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle

import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary
from torch import Tensor, nn

logger = logging.getLogger(__name__)

EMBED_KEY = "encoder.sentence_encoder.embed_tokens.weight"
POSITIONS_KEY = "encoder.sentence_encoder.embed_positions.weight"
TOKEN_TYPES_KEY = "encoder.sentence_encoder.embed_token_types.weight"
IMPORT_INFO = "hf_import.json"  # written beside model.pt by fairseq-clusterformer-import-hf
NEW_PREFIX = "qa_heads."  # the QA heads
NEW_SUFFIX = ".centroids"  # the Cluster-Former layers' centroids (set by K-Means during training)
GATE_SUFFIX = ".long_range_gate"  # a hybrid long-range layer's gate (--long-range-mode hybrid), 0 when built


def allow_namespace_checkpoints() -> None:
    # torch < 2.4 has no allow-list, and its torch.load unpickles anything by default (weights_only=False)
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals([argparse.Namespace])


allow_namespace_checkpoints()


def checkpoint_file(path: str) -> str:
    """``path`` itself, or ``path/model.pt`` for a directory in the published layout (model.pt + dict.txt)."""
    file = os.path.join(path, "model.pt") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"--roberta-path: no checkpoint at {file}")
    return file


def load_roberta_state(path: str) -> dict[str, Tensor]:
    """The model state of a fairseq RoBERTa checkpoint, through fairseq's own loader (with its upgrades)."""
    file = checkpoint_file(path)
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(file)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"--roberta-path {file}: torch's safe unpickler refused it ({str(e).splitlines()[-1]}). If you trust "
            "the file, set TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 to load it the way torch < 2.6 did"
        ) from e
    if "model" not in state:
        raise ValueError(f"--roberta-path {file}: not a fairseq checkpoint (no 'model' entry)")
    return state["model"]


def import_info_file(path: str | None) -> str | None:
    """The ``hf_import.json`` of a ``--roberta-path`` (a directory, or model.pt inside one), or None."""
    if not path:
        return None
    file = os.path.join(path if os.path.isdir(path) else os.path.dirname(path), IMPORT_INFO)
    return file if os.path.isfile(file) else None


def imported_encoder_args(path: str | None) -> dict:
    """The encoder arguments of an imported Hugging Face model at ``--roberta-path`` (empty for fairseq's)."""
    file = import_info_file(path)
    if file is None:
        return {}
    with open(file, encoding="utf-8") as f:
        info = json.load(f)
    if not isinstance(info.get("encoder_args"), dict):
        raise ValueError(f"--roberta-path: {file} has no 'encoder_args'; import the model again")
    return info["encoder_args"]


def check_imported_args(args) -> None:
    """Every encoder argument must be the imported model's: another value would compute another function."""
    path = getattr(args, "roberta_path", None)
    wrong = {k: v for k, v in imported_encoder_args(path).items() if getattr(args, k, None) != v}
    if wrong:
        flags = ", ".join(f"--{k.replace('_', '-')} {getattr(args, k, None)} (imported: {v})" for k, v in wrong.items())
        raise ValueError(
            f"--roberta-path {path} is an imported Hugging Face encoder whose {import_info_file(path)} fixes these "
            f"arguments; leave the flags out or give the imported values: {flags}"
        )


def pretrained_dictionary(path: str | None) -> list[str] | None:
    """Symbols of the pretrained model's dict.txt (fairseq's four specials first), or None without one."""
    if not path:
        return None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--roberta-dict: no such file {path}")
    return list(Dictionary.load(path).symbols)


def remap_rows(pretrained: Tensor, symbols: list[str], ours: list[str], current: Tensor) -> tuple[Tensor, list[str]]:
    """Embedding matrix for our dictionary: a pretrained row wherever our symbol is in the pretrained dictionary,
    the current (freshly initialised) row otherwise. ``pretrained`` may have one row more than ``symbols``: the
    ``<mask>`` that fairseq's masked_lm task appends. Returns (V x C rows, our symbols that are new)."""
    if pretrained.size(0) == len(symbols) + 1 and "<mask>" not in symbols:
        symbols = [*symbols, "<mask>"]
    if pretrained.size(0) != len(symbols):
        raise ValueError(
            f"--roberta-dict lists {len(symbols)} symbols but the checkpoint has {pretrained.size(0)} embedding rows"
        )
    index = {symbol: i for i, symbol in enumerate(symbols)}
    rows = current.detach().clone().to(pretrained.dtype)
    new = []
    for i, symbol in enumerate(ours):
        if symbol in index:
            rows[i] = pretrained[index[symbol]]
        else:
            new.append(symbol)
    return rows, new


def adapt_roberta_state(model: nn.Module, state: dict[str, Tensor], prefix: str, symbols: list[str] | None) -> None:
    """Turn a RoBERTa (masked LM) state dict into one for ``model``, in place."""
    for key in [k for k in state if k.startswith(prefix + "encoder.lm_head.")]:
        del state[key]
    ours = model.state_dict()
    embed = state.get(prefix + EMBED_KEY)
    if embed is not None and symbols is not None:
        state[prefix + EMBED_KEY], new = remap_rows(embed, symbols, model.encoder.dictionary.symbols, ours[EMBED_KEY])
        logger.info(f"embedding rows matched by symbol; new symbols with fresh rows: {new[:10]} ({len(new)} in all)")
    elif embed is not None and embed.shape != ours[EMBED_KEY].shape:
        raise ValueError(
            f"the pretrained embedding has {embed.size(0)} rows, the task's dictionary {ours[EMBED_KEY].size(0)}: "
            "pass the pretrained dict.txt with --roberta-dict so that rows are matched by symbol"
        )
    if TOKEN_TYPES_KEY in ours and prefix + TOKEN_TYPES_KEY not in state:
        raise ValueError(
            f"--type-vocab-size {ours[TOKEN_TYPES_KEY].size(0)}: the pretrained checkpoint has no token-type "
            "embeddings (only an imported BERT or RoBERTa has them)"
        )
    positions = state.get(prefix + POSITIONS_KEY)
    if positions is not None and positions.shape != ours[POSITIONS_KEY].shape:
        raise ValueError(
            f"the pretrained model has {positions.size(0)} position rows, this one {ours[POSITIONS_KEY].size(0)}: "
            "set --max-positions to the pretrained model's (RoBERTa: 512)"
        )
    # only the parts RoBERTa never had: a missing layer weight must still fail the strict load
    added = [
        k
        for k in ours
        if prefix + k not in state and (k.startswith(NEW_PREFIX) or k.endswith((NEW_SUFFIX, GATE_SUFFIX)))
    ]
    for key in added:
        state[prefix + key] = ours[key]
    logger.info(f"pretrained RoBERTa weights loaded; new (not pretrained): {sorted(added)}")
