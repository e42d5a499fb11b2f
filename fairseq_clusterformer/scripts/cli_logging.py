"""Set-up shared by the console scripts: fairseq's log format, and one way to run a script and report bad input."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any


def log_like_fairseq() -> None:
    """fairseq-eval-lm's log format on stdout: its INFO lines (loading, dataset size) stay visible."""
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        level=logging.INFO,
        stream=sys.stdout,
        force=True,  # importing fairseq configured the root logger already
    )


def run_cli(main: Callable[[argparse.Namespace], Any], parser: argparse.ArgumentParser) -> Any:
    """Parse the command line and run ``main``; bad input (a ValueError or a missing file, whose messages name the
    flag or file at fault) ends the script with ``PROG: error: ...`` and status 1 instead of a traceback."""
    args = parser.parse_args()
    try:
        return main(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        sys.exit(1)
