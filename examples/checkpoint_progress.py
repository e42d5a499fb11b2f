"""How far a fairseq run got: print the updates and the training hours saved in a checkpoint ("0 0" when the file
does not exist: a run not started yet), for the recipes that resume runs (examples/code/compare.sh,
examples/qa/cpu_pretrained.sh).

    python examples/checkpoint_progress.py SAVE_DIR/checkpoint_last.pt   ->   "2500 0.61"

The hours matter because fairseq's --stop-time-hours counts those of earlier runs too. Anything else at that path (a
folder, a truncated or corrupted file, a file that is not a fairseq training checkpoint) is an error naming the path,
with exit status 2: read as "0 0", the recipe would train the run again from scratch over it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn


def fail(path: Path, why: str) -> NoReturn:
    print(f"checkpoint_progress.py: {path}: {why}", file=sys.stderr)
    sys.exit(2)


def progress(path: Path) -> tuple[int, float]:
    """(updates, hours) saved in ``path``; (0, 0) when nothing is there."""
    if not os.path.lexists(path):
        if path.parent.exists() and not path.parent.is_dir():
            fail(path, f"{path.parent} is not a folder")
        return 0, 0
    if not path.is_file():
        fail(path, "is a folder, not a checkpoint" if path.is_dir() else "is not a regular file (a broken link?)")
    import torch  # only here: a run not started yet is answered without it, in a fraction of the time

    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError, ... none of which names the file
        size = path.stat().st_size
        fail(path, f"cannot be read as a checkpoint ({size} bytes; truncated or corrupted?): {error}")
    try:
        updates = int(state["optimizer_history"][-1]["num_updates"])
        seconds = float((state.get("extra_state") or {}).get("previous_training_time", 0))
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        fail(path, "is not a fairseq training checkpoint (no optimizer_history with num_updates)")
    return updates, round(seconds / 3600, 6)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(*progress(Path(sys.argv[1])))
