"""Whether the code runs inside a region that ``torch.compile`` is tracing (``--compile-layers``).

A few ops take another form while traced, so that one compiled graph serves every length (``ops.windows.pad_to``,
``WindowScheme.count``) or so that no Python-side cache is read inside the graph (``ops.flex_windows``).
"""

from __future__ import annotations

import torch


def is_compiling() -> bool:
    """True while dynamo traces; always False on a torch without ``torch.compiler.is_compiling`` (before 2.3: setup.py
    allows 2.0.1), which never compiles these layers through ``--compile-layers``'s path."""
    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(check is not None and check())
