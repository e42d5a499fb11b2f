"""Set-up shared by the console scripts: fairseq's log format, and one way to run a script and report bad input."""

from __future__ import annotations

import argparse
import logging
import os
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
    """Parse the command line and run ``main``; bad input (a ValueError, or an OSError such as a missing file or an
    output path that is a directory) ends the script with ``PROG: error: ...`` and status 1 instead of a traceback.
    A ValueError's message names the flag or file at fault; an OSError's is given the flag whose value it names."""
    args = parser.parse_args()
    try:
        return main(args)
    except (ValueError, OSError) as e:
        print(f"{parser.prog}: error: {describe(e, parser, args)}", file=sys.stderr)
        sys.exit(1)


def describe(error: Exception, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The message of ``error``; an OSError raised for one file (``[Errno 21] Is a directory: 'out'``) is told as
    ``--output out: Is a directory`` when that file is the value of a flag."""
    path = getattr(error, "filename", None)
    if not isinstance(error, OSError) or path is None:
        return str(error)
    # argparse keeps no public map from a value back to its flag: its actions hold both
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if isinstance(value, (str, os.PathLike)) and os.path.abspath(value) == os.path.abspath(path):
            flag = action.option_strings[-1] if action.option_strings else action.dest.upper()
            return f"{flag} {path}: {error.strerror}"
    return f"{path}: {error.strerror}"
