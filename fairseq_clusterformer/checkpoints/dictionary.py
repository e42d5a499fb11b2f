"""The training dictionary, recorded in the language model's weights and checked whenever weights are loaded.

A dict.txt of the same size in another order loads without a shape error and scores every token as another word:
a wrong perplexity, exit 0. The task's own check sees only runs with ``--task clusterformer_lm``; ``fairseq-eval-lm
--path`` without ``--task`` (the README's command), ``fairseq-clusterformer-causal-eval``, the hub and a training
resume all build the model with the task's dictionary and load the checkpoint's weights into it, so the check lives
there. V = symbols in the dictionary.
"""

from __future__ import annotations

import hashlib
import logging
import os

import torch
from torch import Tensor, nn

logger = logging.getLogger(__name__)

# the model buffer: one 32-bit hash per symbol (1 MB at WikiText-103's 267k words), so that a mismatch can be named
BUFFER = "dictionary_hashes"

_warned_unrecorded = False


def symbol_hashes(symbols: list[str]) -> Tensor:
    """V int32 hashes of the symbols, in order."""
    digests = (hashlib.blake2b(symbol.encode("utf-8"), digest_size=4).digest() for symbol in symbols)
    return torch.tensor([int.from_bytes(d, "little", signed=True) for d in digests], dtype=torch.int32)


def dictionary_file(task) -> str:
    """The dict.txt that the task read its dictionary from (fairseq's language-modeling tasks read the first data
    directory's), for error messages."""
    for config in (getattr(task, "cfg", None), getattr(task, "args", None)):
        data = getattr(config, "data", None)
        if data:
            return os.path.join(str(data).split(os.pathsep)[0], "dict.txt")
    return "the task's dictionary"


def record_dictionary(model: nn.Module, dictionary, source: str) -> None:
    """Give ``model`` the buffer of ``dictionary``'s symbol hashes; ``source`` (its dict.txt) names it in errors."""
    model.register_buffer(BUFFER, symbol_hashes(dictionary.symbols))
    model.dictionary_source = source
    model.dictionary_symbols = list(dictionary.symbols)
    model.dictionary_specials = dictionary.nspecial


def _describe(model: nn.Module, index: int) -> str:
    symbols, specials = model.dictionary_symbols, model.dictionary_specials
    if index >= len(symbols):
        return f"symbol {index}, which {model.dictionary_source} does not have"
    if index < specials:
        return f"special symbol {index} ({symbols[index]!r})"
    return f"symbol {index} ({symbols[index]!r}, line {index - specials + 1} of {model.dictionary_source})"


def check_dictionary(model: nn.Module, state_dict: dict, checkpoint: str = "the checkpoint") -> None:
    """Raise ValueError when the weights in ``state_dict`` were trained with another dictionary than the model was
    built with, naming the dict.txt and the first symbol that differs. Weights saved before the dictionary was
    recorded load with a warning (once), taking the model's own record so that a strict load passes."""
    global _warned_unrecorded
    current = getattr(model, BUFFER)
    saved = state_dict.get(BUFFER)
    if saved is None:
        if not _warned_unrecorded:
            logger.warning(
                f"this checkpoint does not record its training dictionary: it cannot be checked against "
                f"{model.dictionary_source} (a dictionary of the same size in another order gives wrong scores)"
            )
            _warned_unrecorded = True
        state_dict[BUFFER] = current.detach().clone()
        return
    saved, mine = saved.cpu(), current.cpu()
    if torch.equal(saved, mine):
        return
    shared = min(saved.numel(), mine.numel())
    differs = (saved[:shared] != mine[:shared]).nonzero()
    first = int(differs[0]) if differs.numel() else shared
    raise ValueError(
        f"{checkpoint} was trained with another dictionary than {model.dictionary_source} "
        f"({saved.numel()} symbols in training, {mine.numel()} here); the first that differs is "
        f"{_describe(model, first)}. Evaluate on data binarised with the training run's dictionary "
        "(fairseq-preprocess --srcdict <training data-bin>/dict.txt) and pass that data directory"
    )
