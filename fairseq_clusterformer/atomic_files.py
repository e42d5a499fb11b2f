"""Write files under a temporary name and rename them into place only when the whole job succeeded.

A converter or binariser that dies midway (bad input it could not handle, Ctrl-C, a full disk) must not leave a
half-written file that a later run would take for a finished one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def temp_name(final: Path) -> Path:
    """A hidden temp file beside ``final`` (same filesystem, so ``os.replace`` is atomic) that names its writer's pid,
    so that a later run can tell debris of a dead writer from a live write (``checkpoints/writes.py``)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{time.monotonic_ns()}")


class AtomicFiles:
    """A group of output files committed together: ``path(final)`` gives the temporary path to write to."""

    def __init__(self) -> None:
        self._pending: dict[Path, Path] = {}
        self._created: list[Path] = []  # folders made for the files: removed again on failure

    def path(self, final: str | os.PathLike) -> Path:
        final = Path(final)
        if final.is_dir():
            # refused before anything is written: the rename at the end would fail and leave the temporary behind
            raise IsADirectoryError(errno.EISDIR, "is a directory; give the path of a file", str(final))
        missing = [folder for folder in (final.parent, *final.parent.parents) if not folder.exists()]
        final.parent.mkdir(parents=True, exist_ok=True)
        self._created += missing
        tmp = temp_name(final)
        self._pending[final] = tmp
        return tmp

    def commit(self) -> None:
        try:
            for final, tmp in list(self._pending.items()):
                os.replace(tmp, final)
                del self._pending[final]
            self._created.clear()  # the folders now hold the files
        finally:
            self.discard()  # a rename that failed leaves no hidden temporary behind

    def discard(self) -> None:
        for tmp in self._pending.values():
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self._pending.clear()
        for folder in sorted(self._created, key=lambda f: len(f.parts), reverse=True):  # the deepest first
            with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
                folder.rmdir()
        self._created.clear()


def check_writable(final: str | os.PathLike) -> None:
    """Raise the OSError (naming ``final``) that writing it through ``atomic_group`` would meet, so that a script
    refuses its output path before its work rather than after: a directory at the path, a file where a folder is
    needed, or a nearest existing folder that this user cannot write in (the folders below it would be made)."""
    final = Path(final)
    if final.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory; give the path of a file", str(final))
    folder = final.parent
    while not folder.exists():  # ends at the working directory or the root, which exist
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{folder} is a file, not a folder", str(final))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"this user cannot write in {folder}", str(final))


@contextlib.contextmanager
def atomic_group() -> Iterator[AtomicFiles]:
    """Yield an ``AtomicFiles``; rename everything on a clean exit, delete the temporaries on an exception."""
    files = AtomicFiles()
    try:
        yield files
    except BaseException:
        files.discard()
        raise
    files.commit()


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8"):
    """``open`` for writing through a temporary file that replaces ``path`` only once it is complete."""
    with atomic_group() as files:
        tmp = files.path(path)
        with open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
            yield f


def write_atomically(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` writes the whole file to a temp path, which then replaces ``path`` (removed on any failure)."""
    with atomic_group() as files:
        write(files.path(path))
