"""Early, clear errors for checkpoint files and dictionaries that cannot belong to the run; the memory banks kept in
checkpoint_last.pt only.

torch's own error for a truncated checkpoint does not say which file it was reading, and a checkpoint trained with
another dictionary fails with a size mismatch of embedding matrices; these checks name the file and the cause.
"""

import hashlib
import inspect
import os
import shutil
import time
import zipfile

import torch
from fairseq.checkpoint_utils import torch_persistent_save

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


def checkpoint_files_to_load(task_cfg) -> list[tuple[str, str]]:
    """(flag, path) of the checkpoints this command line will load: fairseq-eval-lm's --path, or fairseq-train's
    --restore-file (default: checkpoint_last.pt in --save-dir); only files that exist (fairseq decides the rest)."""
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
        if restore == "checkpoint_last.pt":
            restore = os.path.join(str(_select(root, "checkpoint", "save_dir")), restore)
        candidates = [("--restore-file", str(restore))]
    return [(flag, path) for flag, path in candidates if os.path.isfile(path)]


def check_checkpoint_file(path: str, flag: str) -> None:
    """Raise ValueError naming ``path`` when it cannot be a complete torch checkpoint (cheap: reads its ends only)."""
    if zipfile.is_zipfile(path):  # finds the zip's central directory, which a truncated file has lost
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
    torch_persistent_save(state, path)
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
        tmp = f"{path}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        shutil.copyfile(first, tmp)
        os.replace(tmp, path)
    return [first, *others]
