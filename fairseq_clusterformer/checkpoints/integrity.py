"""Is a checkpoint file whole? Checked once per load, where every load passes (``compat.patches`` puts
``verify_checkpoint`` in front of fairseq's ``load_checkpoint_to_cpu``).

torch's own error for a truncated checkpoint does not say which file it was reading, and torch.load never checks a
record's CRC-32, so a flipped bit in a weight loads silently and evaluates to a slightly wrong perplexity. The check
reads the whole file once, about as fast as torch.load reads it, and names the file, the flag that named it on the
command line, and the tensor a bad record holds.
"""

from __future__ import annotations

import logging
import os
import sys
import zipfile

from fairseq_clusterformer.checkpoints.records import verify_records

logger = logging.getLogger(__name__)

# torch.save's legacy (pre-1.6, non-zip) format starts with a pickle protocol byte, as fairseq's older published
# checkpoints do; anything else that is not a zip archive is not a checkpoint
_PICKLE_PROTO = b"\x80"

# the command-line flags that name checkpoint files to load (--path may hold several, joined by os.pathsep)
CHECKPOINT_FLAGS = ("--path", "--restore-file", "--finetune-from-model", "--roberta-path")


def _same_file(named: str, path: str) -> bool:
    """Whether the command-line value ``named`` is ``path``: the file, or a directory holding it as model.pt."""
    target = os.path.realpath(path)
    return os.path.realpath(named) == target or os.path.realpath(os.path.join(named, "model.pt")) == target


def flag_naming(path: str, argv: list[str] | None = None) -> str:
    """The command-line flag that named ``path`` (``--restore-file``, ``--path``, ...), for error messages; fairseq's
    default resume file (checkpoint_last.pt, no flag given) is its --restore-file; else "checkpoint"."""
    argv = sys.argv if argv is None else argv
    for index, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag not in CHECKPOINT_FLAGS:
            continue
        if not value and index + 1 < len(argv):
            value = argv[index + 1]
        if any(part and _same_file(part, path) for part in value.split(os.pathsep)):
            return flag
    return "--restore-file" if os.path.basename(path).startswith("checkpoint_last") else "checkpoint"


def verify_checkpoint(path: str, flag: str | None = None) -> None:
    """Raise ValueError naming ``path`` (and ``flag``, default: the flag that named it) when it is not a complete,
    intact torch checkpoint: truncated (no zip directory at its end), or a record whose CRC-32 fails."""
    flag = flag_naming(path) if flag is None else flag
    if zipfile.is_zipfile(path):  # finds the zip's central directory, which a truncated file has lost
        verify_records(path, flag)
        return
    with open(path, "rb") as handle:
        head = handle.read(1)
    if head == _PICKLE_PROTO:
        logger.warning(
            f"{flag} {path} is in torch.save's legacy (non-zip) format, which holds no checksums: its integrity cannot "
            "be checked, and a damaged byte would load silently; save it again with torch.save to get them"
        )
        return
    size = os.path.getsize(path)
    raise ValueError(
        f"{flag} {path} is not a complete PyTorch checkpoint ({size} bytes, no zip directory at its end): the file "
        "is truncated or corrupted (an interrupted copy or save?); use another checkpoint"
    )
