"""Write files under a temporary name and rename them into place only when the whole job succeeded.

A converter or binariser that dies midway (bad input it could not handle, Ctrl-C, a full disk) must not leave a
half-written file that a later run would take for a finished one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


class AtomicFiles:
    """A group of output files committed together: ``path(final)`` gives the temporary path to write to."""

    def __init__(self) -> None:
        self._pending: dict[Path, Path] = {}

    def path(self, final: str | os.PathLike) -> Path:
        final = Path(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        self._pending[final] = tmp
        return tmp

    def commit(self) -> None:
        for final, tmp in self._pending.items():
            os.replace(tmp, final)
        self._pending.clear()

    def discard(self) -> None:
        for tmp in self._pending.values():
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self._pending.clear()


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
