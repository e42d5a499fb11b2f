"""Where a console script (fairseq-preprocess, fairseq-train, this package's tools) is, for the tools, benchmarks
and tests that run one as a subprocess."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def console_script(name: str) -> str:
    """The script beside this Python (a virtual environment's bin/, found even when it is not on PATH), else the one
    on PATH: ``pip install --target DIR`` (the lent GPU machine's bundle) puts scripts in DIR/bin, not beside Python."""
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        raise FileNotFoundError(f"{name}: not beside {sys.executable} nor on PATH; install fairseq (make venv)")
    return found
