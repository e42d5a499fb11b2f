"""Running the shell recipes of examples/ as a user does, and checking that a refused run wrote nothing."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import torch

from tests.conftest import REPO, subprocess_env

EXAMPLES = REPO / "examples"


def snapshot(folder: Path) -> dict[str, str]:
    """Every file, folder and link under ``folder`` with a hash of its bytes (a link: its target, not followed):
    equal snapshots, nothing created or changed."""

    def state(path: Path) -> str:
        if path.is_symlink():
            return f"link to {os.readlink(path)}"
        return "folder" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()

    return {str(path.relative_to(folder)): state(path) for path in sorted(folder.rglob("*"))}


def mark_as_made_by(folder: Path, script: str) -> Path:
    """Leave the marker (examples/recipe_args.sh) that examples/SCRIPT leaves in a folder it made: a folder a test
    builds by hand then stands for one of that recipe's earlier runs, which the recipe takes as its own."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".made-by-recipe").write_text(f"examples/{script}\n")
    return folder


def recipe(name: str, *args, cwd: Path, **env) -> tuple[int, str]:
    """Run examples/NAME with the environment's tools on PATH; (exit status, stdout and stderr together)."""
    full_env = subprocess_env(OMP_NUM_THREADS="1", **env)
    proc = subprocess.run(["bash", str(EXAMPLES / name), *map(str, args)], cwd=cwd, env=full_env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)  # fmt: skip
    return proc.returncode, proc.stdout


def truncated_checkpoint(path: Path) -> Path:
    """A fairseq-shaped checkpoint_last.pt cut in half, as an interrupted copy leaves it."""
    whole = path.parent / "whole.pt"
    path.parent.mkdir(parents=True)
    torch.save({"optimizer_history": [{"num_updates": 7}], "model": {"w": torch.randn(200, 200)}}, whole)
    path.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    whole.unlink()
    return path
