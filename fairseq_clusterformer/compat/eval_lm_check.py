"""fairseq-eval-lm's printed figures checked before they are printed.

The language model refuses log-probabilities that are not finite (``lm.run_checks``), but a damaged checkpoint can
give finite ones that are absurdly low: a legacy (non-zip) file with flipped bytes scored a loss of 1,536.7 bits a
token, and fairseq's ``2**loss`` (a float32 tensor) overflowed to "Perplexity: inf", exit 0. fairseq_cli.eval_lm's
``main`` looks up its module's ``eval_lm`` function when it runs, after ``--user-dir`` imported this package, so the
wrapper here sees the loss and perplexity that ``main`` is about to print and stops, naming the checkpoint, where
either is not finite. Installed only inside fairseq-eval-lm (its module already imported): importing
fairseq_cli.eval_lm elsewhere would configure the root logger as a side effect.
"""

from __future__ import annotations

import functools
import math
import sys


def checkpoint_on_command_line(argv: list[str] | None = None) -> str:
    """``--path FILE`` as the command line gave it, for a message; "the checkpoint" where none was named."""
    argv = sys.argv if argv is None else argv
    for index, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag == "--path":
            value = value or (argv[index + 1] if index + 1 < len(argv) else "")
            return f"--path {value}"
    return "the checkpoint"


def check_printed_scores(results: dict) -> None:
    """Raise naming the checkpoint when the loss or perplexity fairseq-eval-lm would print is not finite."""
    loss, perplexity = float(results["loss"]), float(results["perplexity"])
    if not (math.isfinite(loss) and math.isfinite(perplexity)):
        raise ValueError(
            f"{checkpoint_on_command_line()}: the loss is {loss:,.1f} bits a token, so the perplexity 2**loss is "
            f"{perplexity} (float32 overflows beyond 128 bits): no trained model scores so; the checkpoint's weights "
            "are corrupt (a legacy, non-zip checkpoint has no checksums to catch a damaged file); score another "
            "checkpoint"
        )


def checking_printed_scores(eval_lm):
    @functools.wraps(eval_lm)
    def eval_lm_checked(*args, **kwargs):
        results = eval_lm(*args, **kwargs)
        check_printed_scores(results)
        return results

    eval_lm_checked.patched = True
    return eval_lm_checked


def install_eval_lm_check() -> None:
    """Wrap ``fairseq_cli.eval_lm.eval_lm`` where that module is loaded (idempotent)."""
    module = sys.modules.get("fairseq_cli.eval_lm")
    if module is not None and not getattr(module.eval_lm, "patched", False):
        module.eval_lm = checking_printed_scores(module.eval_lm)
