"""Before a resume: does the checkpoint fit the model these flags build? Checked once, before fairseq loads it.

fairseq loads the weights strictly, so a checkpoint of other shapes fails with a bare missing/unexpected-key error
wrapped in "Cannot load model parameters ... ensure that the architectures match"; and one of the same shapes with
other window, clustering or causality settings loads silently and trains on as another model. These checks read
the checkpoint's index and config (no tensors but the dictionary's record) and name the flags that differ, with the
checkpoint's values and the command line's.
"""

from __future__ import annotations

import inspect
import pickle
import re
import zipfile
from argparse import Namespace

import torch
from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY

from fairseq_clusterformer.checkpoints.dictionary import BUFFER, check_dictionary
from fairseq_clusterformer.checkpoints.records import model_keys, tensor_index

# a Cluster-Former layer's K-Means centroids: ``decoder.layers.10.centroids`` is layer 11, as the flags count
_CENTROIDS_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.centroids$")

_ADVICE = "resume with the checkpoint's settings, or start a new run in another --save-dir"


def cluster_layers(keys) -> list[int]:
    """1-based numbers of the layers whose centroid buffers are among the state-dict ``keys``."""
    return sorted(int(match.group(1)) + 1 for key in keys if (match := _CENTROIDS_KEY.search(key)))


def _saved_model_cfg(index) -> dict:
    """The checkpoint's model config: fairseq saves a plain dict (``cfg``), older versions a Namespace (``args``)."""
    try:
        model_cfg = index["cfg"]["model"] if index.get("cfg") is not None else vars(index["args"])
    except (KeyError, TypeError, AttributeError):
        return {}
    return model_cfg if isinstance(model_cfg, dict) else vars(model_cfg) if isinstance(model_cfg, Namespace) else {}


def saved_task_setting(path: str, name: str):
    """The value of task flag ``name`` (``autocast_bf16``) in the checkpoint's config, read from its index; None where
    the file or its config cannot say (a legacy file, a config of another layout, a flag it predates)."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        index = tensor_index(path)
        task_cfg = index["cfg"]["task"] if index.get("cfg") is not None else index["args"]
    except (pickle.UnpicklingError, KeyError, TypeError, AttributeError, ValueError):
        return None
    return task_cfg.get(name) if isinstance(task_cfg, dict) else getattr(task_cfg, name, None)


def checkpoint_arch(state: dict) -> tuple[str | None, str | None]:
    """(--arch, --task) a loaded checkpoint ``state`` was trained with; fairseq < 0.10 checkpoints keep them in
    ``args``."""
    args = state.get("args")
    if args is not None:
        return getattr(args, "arch", None), getattr(args, "task", None)
    cfg = state.get("cfg") or {}
    model, task = cfg.get("model"), cfg.get("task")
    return getattr(model, "_name", None), getattr(task, "_name", None)


def _same_model(model_cfg: dict, model) -> bool:
    """Whether the checkpoint was written by ``model``'s registered model class (a resume), not another one (a
    RoBERTa or transformer_lm checkpoint to start from, which the model's own loader adapts or fairseq refuses)."""
    name = model_cfg.get("_name") or model_cfg.get("arch")
    name = ARCH_MODEL_NAME_REGISTRY.get(name, name)
    return MODEL_REGISTRY.get(name) is type(model)


def _layer_flags(cfg) -> str:
    """``--long-range-layers 2,4 --long-range-layer cluster``, as far as ``cfg`` (a dict or a config) says."""
    get = cfg.get if isinstance(cfg, dict) else lambda name: getattr(cfg, name, None)
    given = {
        flag: get(name)
        for flag, name in (("--long-range-layers", "long_range_layers"), ("--long-range-layer", "long_range_layer"))
    }
    return " ".join(f"{flag} {value}" for flag, value in given.items() if value is not None)


def _check_cluster_layers(path: str, flag: str, model, saved_keys: set[str], saved_cfg: dict, model_cfg) -> None:
    theirs, ours = cluster_layers(saved_keys), cluster_layers(model.state_dict())
    if theirs == ours:
        return
    has = (
        f"Cluster-Former layers {theirs} (their centroid buffers)"
        if theirs
        else "no K-Means centroid buffers (no Cluster-Former layer: --long-range-layer lsh, sparse or none, or "
        "another architecture)"
    )
    builds = f"Cluster-Former layers {ours}" if ours else "no Cluster-Former layer"
    trained = f" (trained with {_layer_flags(saved_cfg)})" if _layer_flags(saved_cfg) else ""
    raise ValueError(
        f"{flag} {path} has {has}{trained}, but {_layer_flags(model_cfg) or 'the flags'} build {builds}: {_ADVICE}"
    )


def _check_settings(path: str, flag: str, model, saved_cfg: dict, model_cfg) -> None:
    """Every flag the model class names in ``computing_settings`` must have the checkpoint's value."""
    settings = getattr(type(model), "computing_settings", None)
    if settings is None:
        return
    try:
        theirs = settings(Namespace(**saved_cfg))
    except (ValueError, TypeError, AttributeError):  # a config this version cannot read: fairseq's load decides
        return
    ours = settings(model_cfg)
    differ = [name for name in ours if name in theirs and theirs[name] != ours[name]]
    if differ:
        trained = " ".join(f"{name} {theirs[name]}" for name in differ)
        given = " ".join(f"{name} {ours[name]}" for name in differ)
        raise ValueError(
            f"{flag} {path} was trained with {trained}, but the command line gives {given}: the model would compute "
            f"something else than the one trained; {_ADVICE}"
        )


def _saved_tensor(path: str, key: str):
    """One tensor of the checkpoint's model; with mmap only its record is read (torch < 2.1: the whole file)."""
    lazy = {"mmap": True} if "mmap" in inspect.signature(torch.load).parameters else {}
    state = torch.load(path, map_location="cpu", weights_only=False, **lazy)
    return state.get("model", {}).get(key)


def check_resume_fits(path: str, flag: str, model, model_cfg) -> None:
    """Raise ValueError naming ``flag``, ``path`` and what differs when the checkpoint ``model`` resumes from was
    written by the same model class with other Cluster-Former layers, other computing settings or another
    dictionary; checkpoints of other classes (a RoBERTa to start from) are left to the model's own loader."""
    saved = _same_model_index(path, model)
    if saved is None:
        return
    saved_keys, saved_cfg = saved
    _check_cluster_layers(path, flag, model, saved_keys, saved_cfg, model_cfg)
    _check_settings(path, flag, model, saved_cfg, model_cfg)
    _check_saved_dictionary(path, flag, model, saved_keys)


def check_finetune_dictionary(path: str, model) -> None:
    """--finetune-from-model: raise ValueError naming the flag and the file when the weights were trained with another
    dictionary. fairseq would wrap the model's own dictionary error in "Cannot load model parameters ... ensure that
    the architectures match", which buries it; the other settings may differ in a fine-tune and are not checked."""
    saved = _same_model_index(path, model)
    if saved is not None:
        _check_saved_dictionary(path, "--finetune-from-model", model, saved[0])


def _same_model_index(path: str, model) -> tuple[list[str], dict] | None:
    """(state-dict keys, model config) of a checkpoint written by ``model``'s class; None for anything else."""
    if not zipfile.is_zipfile(path):  # the load's integrity check names a truncated file
        return None
    try:
        index = tensor_index(path)
    except pickle.UnpicklingError:  # a global torch's safe loader refuses as well: fairseq's load will say which
        return None
    saved_keys, saved_cfg = model_keys(index), _saved_model_cfg(index)
    if not saved_keys or not _same_model(saved_cfg, model):
        return None
    return saved_keys, saved_cfg


def _check_saved_dictionary(path: str, flag: str, model, saved_keys) -> None:
    if BUFFER in saved_keys and hasattr(model, BUFFER):
        check_dictionary(model, {BUFFER: _saved_tensor(path, BUFFER)}, checkpoint=f"{flag} {path}")
