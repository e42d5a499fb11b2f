"""A stopped and resumed half-precision run scales its loss as the uninterrupted one does.

fairseq 0.12 saves only ``loss_scale`` of ``--memory-efficient-fp16``'s scaler: its iteration counters restarted at 0
on a resume, so the scale grew every ``--fp16-scale-window`` updates counted from the resume instead of the start.
With a window of 3 and 6 updates, an uninterrupted run doubles the scale after updates 3 and 6 (4 -> 16); a run
stopped after update 2 and resumed doubled it only after update 5 (4 -> 8), and went on with another scale.
``--amp``'s GradScaler (not saved at all) goes through the same path on a GPU; ``make gpu-check`` runs it there.
"""

import torch

from fairseq_clusterformer.compat.loss_scaler import SCALER_KEY, restore_scaler, scaler_state
from tests.conftest import TINY_LM_TRAIN, run_ok

HALF = ["--memory-efficient-fp16", "--fp16-init-scale", "4", "--fp16-scale-window", "3", "--seed", "1"]
RUN = [*TINY_LM_TRAIN, *HALF, "--cluster-update-interval", "2", "--no-epoch-checkpoints", "--disable-validation"]


def scaler_of(path) -> tuple[float, dict | None]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    return state["last_optimizer_state"]["loss_scale"], state["extra_state"]["ClusterFormerLMTask"].get(SCALER_KEY)


def test_a_resumed_fp16_run_grows_its_loss_scale_when_the_uninterrupted_run_does(lm_data, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_ok("fairseq-train", lm_data, *RUN, "--max-update", "6", "--save-dir", straight)
    run_ok("fairseq-train", lm_data, *RUN, "--max-update", "2", "--save-dir", resumed)
    out = run_ok("fairseq-train", lm_data, *RUN, "--max-update", "6", "--save-dir", resumed)
    assert "@ 2 updates" in out, out[-3000:]  # it did resume from the stop
    scale, saved = scaler_of(straight / "checkpoint_last.pt")
    resumed_scale, resumed_saved = scaler_of(resumed / "checkpoint_last.pt")
    assert scale == 16.0  # 4 x 2 x 2: doubled after updates 3 and 6, no overflow
    assert resumed_scale == scale  # was 8.0: doubled after update 5 only
    assert saved["state"]["_iter"] == 6 and resumed_saved == saved


def test_a_run_resumed_with_reset_optimizer_starts_its_loss_scaler_afresh(lm_data, tmp_path):
    """fairseq's --reset-optimizer drops the saved loss_scale with the optimizer (and the update count, which it
    keeps there: the run counts from 0 again); the saved counters are not put back either."""
    run_ok("fairseq-train", lm_data, *RUN, "--max-update", "2", "--save-dir", tmp_path)
    out = run_ok("fairseq-train", lm_data, *RUN, "--max-update", "3", "--save-dir", tmp_path, "--reset-optimizer")
    assert "@ 0 updates" in out, out[-3000:]
    scale, saved = scaler_of(tmp_path / "checkpoint_last.pt")
    assert (scale, saved["state"]["_iter"]) == (8.0, 3)  # 3 fresh updates, doubled after the third; restored: _iter 5


def test_a_saved_scaler_state_goes_back_only_into_a_scaler_of_its_kind():
    class Dynamic:  # the fields of fairseq's DynamicLossScaler
        loss_scale, _iter, _last_overflow_iter, _last_rescale_iter, _overflows_since_rescale = 8.0, 5, -1, 3, 0

    class Optimizer:
        def __init__(self, scaler):
            self.scaler = scaler

    saved = scaler_state(Optimizer(Dynamic()))
    assert saved == {
        "kind": "dynamic",
        "state": {
            "loss_scale": 8.0, "_iter": 5, "_last_overflow_iter": -1, "_last_rescale_iter": 3,
            "_overflows_since_rescale": 0,
        },
    }  # fmt: skip
    fresh = Dynamic()
    fresh.loss_scale, fresh._iter = 128.0, 0
    assert restore_scaler(Optimizer(fresh), saved) and (fresh.loss_scale, fresh._iter) == (8.0, 5)
    assert scaler_state(Optimizer(None)) is None and not restore_scaler(Optimizer(None), saved)
    grad_scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    grad_scaler.scale(torch.ones(()))  # creates the scale tensor
    grad_scaler.update(new_scale=32.0)
    amp = scaler_state(Optimizer(grad_scaler))
    assert amp["kind"] == "grad_scaler" and amp["state"]["scale"] == 32.0
    assert not restore_scaler(Optimizer(fresh), amp) and fresh.loss_scale == 8.0  # another kind: left alone
    other = torch.amp.GradScaler("cpu", init_scale=128.0)
    assert restore_scaler(Optimizer(other), amp) and other.get_scale() == 32.0
