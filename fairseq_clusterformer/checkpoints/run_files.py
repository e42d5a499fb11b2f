"""Which checkpoint files a command line will load: fairseq-eval-lm's --path, fairseq-train's --restore-file (or the
save dir's checkpoint_last.pt), read from the fairseq config a task belongs to.

fairseq only logs "No existing checkpoint found" for a --restore-file that does not exist and trains from scratch,
over the checkpoints of the run it was meant to resume: an explicitly named one that is missing is an error here.
"""

from __future__ import annotations

import glob
import os

from fairseq.file_io import PathManager


def root_config(cfg):
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
    root = root_config(task_cfg)
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
    root = root_config(task_cfg)
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


def finetune_file(task_cfg) -> str | None:
    """fairseq-train's --finetune-from-model when fairseq will load it: given, a file, and no checkpoint_last.pt in
    --save-dir (fairseq resumes from that one instead)."""
    root = root_config(task_cfg)
    path = None if root is None else _select(root, "checkpoint", "finetune_from_model")
    if not path or not os.path.isfile(str(path)):
        return None
    if _exists(os.path.join(str(_select(root, "checkpoint", "save_dir")), "checkpoint_last.pt")):
        return None
    return str(path)


def is_last_checkpoint(path: str) -> bool:
    """checkpoint_last.pt, or a shard of it (checkpoint_last-shard0.pt): the file an automatic resume reads."""
    return os.path.basename(path).startswith("checkpoint_last")
