"""``--compile-layers`` through the real console scripts: a checkpoint trained eagerly and evaluated by
``fairseq-eval-lm`` with its layers compiled (``--model-overrides``) scores the text as the eager evaluation does, and
``fairseq-train --compile-layers on`` trains (its layers compiled) to a checkpoint that records the flag.

Slow on a CPU (Inductor builds the evaluation graphs of both layer kinds, then the training ones: minutes cold).
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.conftest import PACKAGE, TINY_LM_TRAIN, run_ok

# --compile-layers needs torch >= 2.3: the official fairseq 0.12.2 environment (torch 2.0.1) runs the e2e tests too
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(getattr(torch, "compiler", None), "is_compiling"), reason="torch < 2.3"),
]
SCORE = re.compile(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)")


def eval_lm(data, checkpoint, *extra) -> tuple[float, float]:
    out = run_ok(
        "fairseq-eval-lm", data, "--user-dir", PACKAGE, "--path", checkpoint, "--tokens-per-sample", "200",
        "--max-sentences", "4", "--gen-subset", "valid", "--num-workers", "0", *extra,
    )  # fmt: skip
    loss, ppl = SCORE.search(out).groups()
    return float(loss), float(ppl)


def test_compiled_training_and_evaluation_match_eager(lm_data, tmp_path):
    save = tmp_path / "eager"
    run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, "--max-update", "2", "--save-dir", save, "--no-epoch-checkpoints")
    checkpoint = save / "checkpoint_last.pt"
    eager = eval_lm(lm_data, checkpoint)
    compiled = eval_lm(lm_data, checkpoint, "--model-overrides", "{'compile_layers': 'on'}")
    # the compiled kernels sum in another order: the validation loss agrees to float32 rounding
    assert compiled == pytest.approx(eager, rel=1e-4)

    save = tmp_path / "compiled"
    out = run_ok(
        "fairseq-train", lm_data, *TINY_LM_TRAIN, "--max-update", "2", "--save-dir", save, "--no-epoch-checkpoints",
        "--compile-layers", "on",
    )  # fmt: skip
    assert "done training" in out
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["compile_layers"] == "on"
    assert not any("_orig_mod" in key for key in state["model"])
