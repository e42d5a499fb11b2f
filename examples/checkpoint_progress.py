"""How far a fairseq run got: print the updates and the training hours saved in a checkpoint ("0 0" when the file
does not exist: a run not started yet), for the recipes that resume runs (examples/code/compare.sh,
examples/qa/train.sh, which examples/qa/cpu_pretrained.sh asks).

    python examples/checkpoint_progress.py SAVE_DIR/checkpoint_last.pt   ->   "2500 0.61"
    python examples/checkpoint_progress.py SAVE_DIR/checkpoint_last.pt --expect max_update=800 --expect lr=1e-4

--expect NAME=VALUE (repeatable): the checkpoint was trained with that setting, NAME a leaf of its saved fairseq
configuration in any group (max_update, lr, batch_size, seed, num_clusters, ...). A run folder named as this call's run
but trained with other settings (another budget's run under the same --out, say) is refused, naming each setting that
differs, with exit status 2: resumed, it would continue under this call's schedule, and scored, it would pass for a run
of this call's settings.

The hours matter because fairseq's --stop-time-hours counts those of earlier runs too. Anything else at that path (a
folder, a truncated or corrupted file, a file that is not a fairseq training checkpoint) is an error naming the path,
with exit status 2: read as "0 0", the recipe would train the run again from scratch over it."""

from __future__ import annotations

import os
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any, NoReturn


def fail(path: Path, why: str) -> NoReturn:
    print(f"checkpoint_progress.py: {path}: {why}", file=sys.stderr)
    sys.exit(2)


def load(path: Path) -> dict | None:
    """The checkpoint saved at ``path``; None when nothing is there."""
    if not os.path.lexists(path):
        if path.parent.exists() and not path.parent.is_dir():
            fail(path, f"{path.parent} is not a folder")
        return None
    if not path.is_file():
        fail(path, "is a folder, not a checkpoint" if path.is_dir() else "is not a regular file (a broken link?)")
    import torch  # only here: a run not started yet is answered without it, in a fraction of the time

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError, ... none of which names the file
        size = path.stat().st_size
        fail(path, f"cannot be read as a checkpoint ({size} bytes; truncated or corrupted?): {error}")


def progress(path: Path, state: dict | None = None) -> tuple[int, float]:
    """(updates, hours) saved in ``path`` (already loaded: ``state``); (0, 0) when nothing is there."""
    state = load(path) if state is None else state
    if state is None:
        return 0, 0
    try:
        updates = int(state["optimizer_history"][-1]["num_updates"])
        seconds = float((state.get("extra_state") or {}).get("previous_training_time", 0))
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        fail(path, "is not a fairseq training checkpoint (no optimizer_history with num_updates)")
    return updates, round(seconds / 3600, 6)


def saved_settings(state: dict) -> dict[str, list[Any]]:
    """Every leaf of the checkpoint's configuration (``cfg``, or ``args`` of older fairseq): name -> its values, one
    per group that holds it (a name like ``lr`` sits in more than one). fairseq saves ``cfg`` as plain containers,
    with a legacy model's or task's options as a Namespace inside."""

    def plain(node: Any) -> Any:
        return vars(node) if isinstance(node, Namespace) else node

    leaves: dict[str, list[Any]] = {}

    def walk(node: Any) -> None:
        node = plain(node)
        for name, value in node.items():
            value = plain(value)
            if isinstance(value, dict):
                walk(value)
            else:
                leaves.setdefault(name, []).append(value)

    walk(state.get("cfg") or state.get("args") or {})
    return leaves


def one(saved: Any) -> Any:
    """fairseq keeps --lr and --update-freq as lists of one value: that value."""
    return saved[0] if isinstance(saved, (list, tuple)) and len(saved) == 1 else saved


def same(saved: Any, expected: str) -> bool:
    saved = one(saved)
    if isinstance(saved, bool) or not isinstance(saved, (int, float)):
        return str(saved) == expected
    try:
        return float(saved) == float(expected)
    except ValueError:
        return False


def check_settings(path: Path, state: dict, expected: dict[str, str]) -> None:
    leaves = saved_settings(state)
    missing = sorted(set(expected) - set(leaves))
    if missing:
        fail(path, f"its saved configuration has no setting {', '.join(missing)} (--expect names a fairseq option)")
    differ = [f"{name} {' / '.join(dict.fromkeys(str(one(v)) for v in leaves[name]))} (this call: {value})"
              for name, value in expected.items() if not all(same(v, value) for v in leaves[name])]  # fmt: skip
    if differ:
        fail(path, "was trained with other settings: " + "; ".join(differ) + ". It is another run's checkpoint "
             "(another budget's, under the same folder?): give this run another folder (--out, SAVE_DIR), or move "
             "that one away")


def main(argv: list[str]) -> None:
    expected: dict[str, str] = {}
    if not argv or len(argv) % 2 == 0 or any(flag != "--expect" for flag in argv[1::2]):
        sys.exit(__doc__)
    for pair in argv[2::2]:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            sys.exit(f"checkpoint_progress.py: --expect {pair}: expected NAME=VALUE")
        expected[name] = value
    path = Path(argv[0])
    state = load(path)
    updates, hours = progress(path, state)
    if expected and state is not None:
        check_settings(path, state, expected)
    print(updates, hours)


if __name__ == "__main__":
    main(sys.argv[1:])
