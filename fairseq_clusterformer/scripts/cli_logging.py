"""Logging set-up shared by the console scripts that run next to fairseq's own tools."""

from __future__ import annotations

import logging
import sys


def log_like_fairseq() -> None:
    """fairseq-eval-lm's log format on stdout: its INFO lines (loading, dataset size) stay visible."""
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        level=logging.INFO,
        stream=sys.stdout,
        force=True,  # importing fairseq configured the root logger already
    )
