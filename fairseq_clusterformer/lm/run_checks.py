"""What the language model says about the run it is in, where fairseq would go on without a word.

- A sliding window as long as the training sample or longer (``--window-size 512 --tokens-per-sample 200``): every
  window holds the whole sample, every layer attends over all of it, and the long-range layers see nothing the
  sliding windows do not. It is not refused: a window over the whole sample is how the dense baseline is made (with
  ``--long-range-layer none`` nothing is said), and a checkpoint trained so must still load.
- Scores that are not finite: a checkpoint with corrupt weights (a flipped byte in a legacy torch.save file, which
  has no checksums) gives NaN/Inf log-probabilities, and fairseq-eval-lm would print "Perplexity: inf" and exit 0.
  A scoring pass (a ``sample`` given, the model in evaluation mode: fairseq-eval-lm, causal-eval, longrange) stops
  with an error naming the checkpoint on the command line. Generation and training never check (no ``sample`` is
  given there), so neither waits for the device. Finite log-probabilities can still add up to a loss whose
  perplexity overflows: ``compat.eval_lm_check`` checks what fairseq-eval-lm prints.
"""

from __future__ import annotations

import logging

import torch
from fairseq.utils import safe_getattr
from torch import Tensor

from fairseq_clusterformer.compat.eval_lm_check import checkpoint_on_command_line

logger = logging.getLogger(__name__)


def warn_window_covers_sample(args) -> None:
    """Warn, naming both flags, when --window-size is not below --tokens-per-sample and long-range layers exist."""
    tokens = safe_getattr(args, "tokens_per_sample", None)
    kind = str(safe_getattr(args, "long_range_layer", "none"))
    if tokens is None or kind == "none" or args.window_size < tokens:
        return
    logger.warning(
        f"--window-size {args.window_size} is not below --tokens-per-sample {tokens}: every window holds the whole "
        f"sample, so the long-range layers (--long-range-layer {kind}) see nothing the sliding windows do not; use a "
        "--window-size below --tokens-per-sample (or --long-range-layer none for a dense baseline)"
    )


def check_finite_scores(log_probs: Tensor) -> None:
    """Raise naming the checkpoint when a scoring pass's log-probabilities (B x T x V) hold NaN or Inf."""
    if not bool(torch.isfinite(log_probs).all()):
        raise ValueError(
            f"{checkpoint_on_command_line()}: the model's log-probabilities are not finite (NaN/Inf), so its loss "
            "and perplexity would be too: the checkpoint's weights are corrupt (a legacy, non-zip checkpoint has no "
            "checksums to catch a damaged file) or overflow at this precision; score another checkpoint"
        )
