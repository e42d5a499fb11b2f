"""Early, clear errors for checkpoint files and dictionaries that cannot belong to the run; the memory banks kept in
checkpoint_last.pt only.

torch's own error for a truncated checkpoint does not say which file it was reading, and a checkpoint trained with
another dictionary fails with a size mismatch of embedding matrices; these checks name the file and the cause.
"""

from __future__ import annotations

import glob
import hashlib
import inspect
import os
import pickle
import re
import zipfile
from argparse import Namespace

import torch
from fairseq.file_io import PathManager
from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY

from fairseq_clusterformer.tasks.checkpoint_records import model_keys, tensor_index, verify_records
from fairseq_clusterformer.tasks.checkpoint_writes import atomic_copy, atomic_save

# torch.save's legacy (pre-1.6, non-zip) format starts with a pickle protocol byte, as fairseq's older published
# checkpoints do; anything else that is not a zip archive is not a checkpoint
_PICKLE_PROTO = b"\x80"


def _root_config(cfg):
    """The whole fairseq config that a task's config node belongs to, or None (a task built by hand)."""
    node, parent = cfg, getattr(cfg, "_get_parent", lambda: None)()
    while parent is not None:
        node, parent = parent, parent._get_parent()
    return node if node is not cfg else None


def _select(root, group: str, key: str):
    section = getattr(root, group, None)
    return getattr(section, key, None) if section is not None else None


def save_dir_of(task_cfg) -> str | None:
    """fairseq-train's --save-dir for the run a task's config belongs to (None: a task built by hand)."""
    root = _root_config(task_cfg)
    save_dir = _select(root, "checkpoint", "save_dir") if root is not None else None
    return None if save_dir is None else str(save_dir)


def _exists(path: str) -> bool:
    """A checkpoint fairseq can load from ``path``: the file, or its shards (``-shard0.pt``, ``-model_part-0.pt``)."""
    if PathManager.path_requires_pathmanager(path):
        return PathManager.exists(path)
    stem, extension = os.path.splitext(path)
    return os.path.isfile(path) or bool(glob.glob(glob.escape(stem) + "-*" + extension))


def check_restore_file(restore: str, save_dir: str) -> None:
    """An explicitly named --restore-file must exist: fairseq only logs "No existing checkpoint found" and trains
    from scratch, over the checkpoint_last.pt and checkpoint_best.pt of the run it was meant to resume."""
    if _exists(restore):
        return
    hint = ""
    beside = os.path.join(save_dir, restore)
    if not os.path.isabs(restore) and _exists(beside):
        hint = f" (a relative path is read from the working directory: did you mean {beside}?)"
    raise FileNotFoundError(
        f"--restore-file {restore} does not exist{hint}: without it fairseq would train from scratch and write "
        f"over checkpoint_last.pt and checkpoint_best.pt in --save-dir {save_dir}. Fix the path, or leave "
        "--restore-file out to resume from --save-dir's checkpoint_last.pt"
    )


def checkpoint_files_to_load(task_cfg) -> list[tuple[str, str]]:
    """(flag, path) of the checkpoints this command line will load: fairseq-eval-lm's --path, or fairseq-train's
    --restore-file (default: checkpoint_last.pt in --save-dir, when there is one). An explicitly named
    --restore-file that does not exist is an error (``check_restore_file``); the rest fairseq decides."""
    root = _root_config(task_cfg)
    if root is None:
        return []
    eval_paths = _select(root, "common_eval", "path")
    if eval_paths:
        candidates = [("--path", path) for path in str(eval_paths).split(os.pathsep)]
    else:
        restore = _select(root, "checkpoint", "restore_file")
        if restore is None:
            return []
        save_dir = str(_select(root, "checkpoint", "save_dir"))
        if restore == "checkpoint_last.pt":  # fairseq's default: not a name the user chose
            restore = os.path.join(save_dir, restore)
        else:
            check_restore_file(str(restore), save_dir)
        candidates = [("--restore-file", str(restore))]
    return [(flag, path) for flag, path in candidates if os.path.isfile(path)]


# (real path, size, mtime) of the files that passed: the task checks at set-up and again when the model is built
_VERIFIED: set[tuple[str, int, int]] = set()


def check_checkpoint_file(path: str, flag: str) -> None:
    """Raise ValueError naming ``path`` when it is not a complete, intact torch checkpoint: truncated (no zip
    directory at its end), or a record whose CRC-32 fails (reads the whole file once, about as fast as torch.load
    reads it; a file that passed is not read again while its size and mtime stay)."""
    stat = os.stat(path)
    identity = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if identity in _VERIFIED:
        return
    if zipfile.is_zipfile(path):  # finds the zip's central directory, which a truncated file has lost
        verify_records(path, flag)
        _VERIFIED.add(identity)
        return
    with open(path, "rb") as handle:
        head = handle.read(1)
    if head == _PICKLE_PROTO:
        return
    size = os.path.getsize(path)
    raise ValueError(
        f"{flag} {path} is not a complete PyTorch checkpoint ({size} bytes, no zip directory at its end): the file "
        "is truncated or corrupted (an interrupted copy or save?); use another checkpoint"
    )


def dictionary_fingerprint(dictionary) -> dict:
    """Size and a hash of the symbols, in order: two dictionaries with equal fingerprints map tokens alike."""
    digest = hashlib.sha1("\n".join(dictionary.symbols).encode("utf-8")).hexdigest()
    return {"size": len(dictionary), "sha1": digest}


def check_dictionary(saved: dict, dictionary, dict_file: str) -> None:
    current = dictionary_fingerprint(dictionary)
    if saved == current:
        return
    detail = (
        f"{saved['size']} symbols against {current['size']} in {dict_file}"
        if saved["size"] != current["size"]
        else f"the same number of symbols ({current['size']}) but in a different order or spelling than {dict_file}"
    )
    raise ValueError(
        f"the checkpoint was trained with another dictionary: {detail}. Evaluate on data binarised with the "
        "training run's dict.txt (fairseq-preprocess --srcdict <training data-bin>/dict.txt)"
    )


# a Cluster-Former layer's K-Means centroids: ``decoder.layers.10.centroids`` is layer 11, as the flags count
_CENTROIDS_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.centroids$")


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


def _same_model(model_cfg: dict, model) -> bool:
    """Whether the checkpoint was written by ``model``'s registered model class (a resume), not another one (a
    RoBERTa or transformer_lm checkpoint to start from, which the model's own loader adapts or fairseq refuses)."""
    name = model_cfg.get("_name") or model_cfg.get("arch")
    name = ARCH_MODEL_NAME_REGISTRY.get(name, name)
    return MODEL_REGISTRY.get(name) is type(model)


def _saved_flags(model_cfg: dict) -> str:
    """The checkpoint's own --long-range-layers / --long-range-layer, when its config says."""
    flags = {"--long-range-layers": "long_range_layers", "--long-range-layer": "long_range_layer"}
    given = {flag: model_cfg.get(name) for flag, name in flags.items()}
    given = {flag: value for flag, value in given.items() if value is not None}
    return " (trained with " + " ".join(f"{flag} {value}" for flag, value in given.items()) + ")" if given else ""


def check_model_fits(path: str, flag: str, model, flags: str) -> None:
    """Before fairseq loads ``path`` into ``model`` (strictly, with a bare missing/unexpected-key error): say which
    Cluster-Former layers the checkpoint has and which ones the command line's ``flags`` build, when they differ."""
    if not zipfile.is_zipfile(path):
        return
    try:
        index = tensor_index(path)
    except pickle.UnpicklingError:  # a global torch's safe loader refuses as well: fairseq's load will say which
        return
    saved, model_cfg = model_keys(index), _saved_model_cfg(index)
    if not saved or not _same_model(model_cfg, model):
        return
    theirs, ours = cluster_layers(saved), cluster_layers(model.state_dict())
    if theirs == ours:
        return
    has = (
        f"Cluster-Former layers {theirs} (their centroid buffers)"
        if theirs
        else "no K-Means centroid buffers (no Cluster-Former layer: --long-range-layer lsh, sparse or none, or "
        "another architecture)"
    )
    builds = f"Cluster-Former layers {ours}" if ours else "no Cluster-Former layer"
    raise ValueError(
        f"{flag} {path} has {has}{_saved_flags(model_cfg)}, but {flags} build {builds}: resume with the checkpoint's "
        "settings, or start a new run in another --save-dir"
    )


# a file's mtime comes from the kernel's coarse clock, which may lag time.time() a little
_MTIME_SLACK_S = 1.0


def is_last_checkpoint(path: str) -> bool:
    """checkpoint_last.pt, or a shard of it (checkpoint_last-shard0.pt): the file an automatic resume reads."""
    return os.path.basename(path).startswith("checkpoint_last")


def copies_of(first: str, since: float) -> list[str]:
    """The checkpoints fairseq copied from ``first`` (the one file it wrote) in the save that began at ``since``:
    the same size, written since then; ``first`` included."""
    folder, size = os.path.dirname(first) or ".", os.path.getsize(first)
    copies = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not (name.startswith("checkpoint") and name.endswith(".pt") and os.path.isfile(path)):
            continue
        if os.path.getsize(path) == size and os.path.getmtime(path) >= since - _MTIME_SLACK_S:
            copies.append(path)
    return copies


def drop_memory_banks(path: str, task_key: str, state_key: str) -> bool:
    """Rewrite a checkpoint without the memory banks in ``extra_state[task_key][state_key]`` (atomically); False
    when it has none. mmap: only the kept tensors are read, and not all at once."""
    # torch < 2.1 (the official fairseq 0.12.2 set-up) has no mmap: it reads the whole file
    lazy = {"mmap": True} if "mmap" in inspect.signature(torch.load).parameters else {}
    state = torch.load(path, map_location="cpu", weights_only=False, **lazy)
    refresh = state.get("extra_state", {}).get(task_key, {}).get(state_key)
    if refresh is None or refresh.get("banks") is None:
        return False
    refresh["banks"] = None
    atomic_save(state, path)
    return True


def keep_banks_in_last_only(first: str, since: float, task_key: str, state_key: str) -> list[str]:
    """After a save: the memory banks stay in checkpoint_last.pt only, every other file just written loses them.

    fairseq writes one file (``first``, the epoch, update or best checkpoint when any is due) and copies it to the
    others, so all of them carry the banks (0.8 GB at WikiText-103 size), which only resuming from checkpoint_last.pt
    needs. Returns the files rewritten."""
    if is_last_checkpoint(first) or not os.path.isfile(first):  # async writes: the file may not be there yet
        return []
    others = [path for path in copies_of(first, since) if path != first and not is_last_checkpoint(path)]
    if not drop_memory_banks(first, task_key, state_key):
        return []
    for path in others:
        atomic_copy(first, path)
    return [first, *others]
