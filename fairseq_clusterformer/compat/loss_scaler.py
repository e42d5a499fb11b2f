"""The half-precision loss scaler's whole state across a resume, which fairseq 0.12 does not save.

``--amp`` scales the loss with a ``torch.amp.GradScaler`` whose scale and growth counter fairseq 0.12 leaves out of
its checkpoints: a resumed run starts again at ``--amp-init-scale``, overflows where the uninterrupted run did not,
skips that update and from then on trains on other batches (seen on an H100: a run stopped at update 28 restarted at
scale 128 against 64 and skipped update 33; its memory banks, weights and optimizer moments no longer matched).
``--fp16`` and ``--memory-efficient-fp16`` keep only ``loss_scale`` of their ``DynamicLossScaler``: its iteration
counters restart at 0, so the scale grows every ``--fp16-scale-window`` updates counted from the resume, not from the
start (and an overflow's back-off is judged against the wrong count).

The task saves the scaler's state beside its memory banks (``extra_state[<task class>]``) and puts it back into the
optimizer's scaler before the first resumed step, when fairseq brought the optimizer's state back: under
``--reset-optimizer`` the scaler starts fresh, as fairseq's own ``loss_scale`` does. A checkpoint saved by another
precision flag, or by a run without one, leaves the scaler as fairseq built it.
"""

from __future__ import annotations

from typing import Any

import torch

SCALER_KEY = "loss_scaler"
# fairseq builds torch.cuda.amp.GradScaler, a subclass of torch.amp.GradScaler from torch 2.3 on (torch 2.0 has only
# the CUDA one)
GRAD_SCALERS = tuple(c for c in (getattr(torch.amp, "GradScaler", None), torch.cuda.amp.GradScaler) if c is not None)
# DynamicLossScaler (fairseq.optim.dynamic_loss_scaler): what update() and check_overflow() read and write
DYNAMIC_FIELDS = ("loss_scale", "_iter", "_last_overflow_iter", "_last_rescale_iter", "_overflows_since_rescale")


def scaler_state(optimizer: Any) -> dict | None:
    """The state of the optimizer's loss scaler, or None without one (fp32, bf16) or when it is disabled."""
    scaler = getattr(optimizer, "scaler", None)
    if isinstance(scaler, GRAD_SCALERS):
        state = scaler.state_dict()  # {} when disabled (no CUDA); reads the scale back from the device once
        return {"kind": "grad_scaler", "state": state} if state else None
    if scaler is not None and all(hasattr(scaler, name) for name in DYNAMIC_FIELDS):
        return {"kind": "dynamic", "state": {name: getattr(scaler, name) for name in DYNAMIC_FIELDS}}
    return None


def optimizer_state_loaded(optimizer: Any) -> bool:
    """Before the first step of a run: whether fairseq loaded the optimizer's state from the checkpoint (Adam's
    moments are there), i.e. the run was not started with ``--reset-optimizer``. True where it cannot be told."""
    state = getattr(getattr(optimizer, "optimizer", None), "state", None)  # the torch optimizer fairseq wraps
    return state is None or len(state) > 0


def restore_scaler(optimizer: Any, saved: dict) -> bool:
    """Put a saved state into the optimizer's scaler when it is of the same kind; True if it did."""
    current = scaler_state(optimizer)
    if current is None or current["kind"] != saved.get("kind"):
        return False
    if saved["kind"] == "grad_scaler":
        optimizer.scaler.load_state_dict(saved["state"])
    else:
        for name in DYNAMIC_FIELDS:
            setattr(optimizer.scaler, name, saved["state"][name])
    return True


class LossScalerResumeHooks:
    """fairseq task methods that carry the loss scaler across a resume; mixed in before ``CentroidRefreshHooks``,
    whose entry ``extra_state[<task class>]`` it shares (fairseq hands a task back only that entry)."""

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        self._optimizer = optimizer  # the optimizer whose scaler the next checkpoint saves
        saved = getattr(self, "_saved_scaler", None)
        if saved is not None:  # the first step after a resume
            self._saved_scaler = None
            if optimizer_state_loaded(optimizer):  # not under --reset-optimizer
                restore_scaler(optimizer, saved)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def get_checkpoint_dict(self):
        state = getattr(super(), "get_checkpoint_dict", dict)()
        scaler = scaler_state(getattr(self, "_optimizer", None))
        if scaler is None:
            return state
        name = type(self).__name__
        return {**state, name: {**state.get(name, {}), SCALER_KEY: scaler}}

    def set_checkpoint_dict(self, state):
        base = getattr(super(), "set_checkpoint_dict", None)
        if base is not None:
            base(state)
        self._saved_scaler = state.get(SCALER_KEY)  # installed at the next train_step, which has the optimizer
