"""Architecture presets, fairseq's arch-function convention: a registered ``--arch`` fills only the settings the
command line left unset. fairseq 0.12 writes ``args.x = getattr(args, "x", default)`` once per setting; the LM's
and the QA model's presets share this one helper instead."""

from fairseq.utils import safe_getattr


def set_defaults(args, **defaults) -> None:
    """Set each of ``defaults`` on ``args`` where the command line (or an earlier preset) did not."""
    for name, value in defaults.items():
        setattr(args, name, safe_getattr(args, name, value))
