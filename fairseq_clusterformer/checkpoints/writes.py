"""Checkpoint writes that a kill cannot leave half done, and the clean-up of what killed runs left behind.

fairseq 0.12 saves a checkpoint to ``<file>.tmp`` and renames it (atomic), but then *copies* that file onto
checkpoint_last.pt, checkpoint_best.pt, ... with ``PathManager.copy``, in place: a kill during the copy leaves a
truncated checkpoint_last.pt. A kill during the save leaves ``<file>.tmp``, which nothing ever removes (gigabytes each
at WikiText-103 size). With the plug-in loaded both go through a temp file in the same directory named
``.<file>.tmp-<pid>-<ns>`` (``atomic_files``, as every file the plug-in writes; ``compat.patches`` routes fairseq's
save and copy here) and ``os.replace``: a reader sees the old file or the new one, never a part, and the pid in the
name tells the next run whether the writer is gone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time

import torch

from fairseq_clusterformer.atomic_files import write_atomically

logger = logging.getLogger(__name__)

# .checkpoint_last.pt.tmp-4242-123456789 (ours, with the writer's pid: ``atomic_files.temp_name``; without the
# dot from earlier versions) and checkpoint_1_8.pt.tmp (fairseq's own)
_TAGGED_TEMP = re.compile(r"^\.?checkpoint.*\.pt\.tmp-(\d+)-\d+$")
_FAIRSEQ_TEMP = re.compile(r"^checkpoint.*\.pt\.tmp$")
# fairseq's temp file has no pid: it is debris once nothing has written to it for this long (a live save writes
# continuously, so its mtime keeps moving)
FAIRSEQ_TEMP_IDLE_S = 600.0


def atomic_copy(src: str, dst: str) -> None:
    write_atomically(dst, lambda tmp: shutil.copyfile(src, tmp))


def atomic_save(obj, path: str) -> None:
    def write(tmp) -> None:
        with open(tmp, "wb") as handle:
            torch.save(obj, handle)

    write_atomically(path, write)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():  # a run that has not written yet: the file is from an earlier process with our pid
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def stale_temp_files(folder: str, now: float | None = None) -> list[tuple[str, str]]:
    """(path, why) of the checkpoint temp files in ``folder`` that no live writer owns: ours whose pid is dead,
    fairseq's untouched for ``FAIRSEQ_TEMP_IDLE_S``."""
    now = time.time() if now is None else now
    stale = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        tagged = _TAGGED_TEMP.match(name)
        if tagged and not _pid_alive(int(tagged.group(1))):
            stale.append((path, f"its writer, process {tagged.group(1)}, is gone"))
        elif _FAIRSEQ_TEMP.match(name):
            idle = now - os.path.getmtime(path)
            if idle >= FAIRSEQ_TEMP_IDLE_S:
                stale.append((path, f"not written to for {idle:.0f}s"))
            else:
                logger.warning(f"kept {path}: written to {idle:.0f}s ago, a save may still be under way")
    return stale


def remove_stale_temp_files(folder: str) -> list[str]:
    """Remove the debris of killed saves and copies from the save dir (call once, at the start of a run, on the
    rank that writes checkpoints); logs every file removed with its size and why."""
    removed = []
    for path, why in stale_temp_files(folder):
        size = os.path.getsize(path)
        try:
            os.remove(path)
        except FileNotFoundError:  # another process cleaned it first
            continue
        logger.warning(f"removed {path} ({size / 2**20:.1f} MiB), left by a killed checkpoint write: {why}")
        removed.append(path)
    return removed
