"""``--autocast-bf16``: training under ``torch.autocast`` in bfloat16, which fairseq 0.12 has no flag for.

fairseq's ``--bf16`` converts the model itself to bfloat16 (its TPU path: bfloat16 weights, layer norms and softmax)
and ``--amp`` autocasts to float16 behind a loss scaler (``FairseqTask.train_step`` opens
``torch.cuda.amp.autocast``, whose dtype is float16). With ``--autocast-bf16`` the training forward pass, model and
criterion, runs under ``torch.autocast(<the model's device type>, dtype=torch.bfloat16)``: matrix products and
attention in bfloat16; layer norms, softmax and the loss in float32 (autocast's own lists); weights, gradients and
Adam's moments stay float32 and no loss scale is needed (bfloat16 has float32's exponent range). Validation and
prediction run in float32. It works on a CPU too (``torch.autocast("cpu")`` takes bfloat16), which the tests use.

No ``from __future__ import annotations`` here: fairseq reads the config field types at run time.
"""

from dataclasses import dataclass, field

import torch
from fairseq.optim.amp_optimizer import AMPOptimizer
from fairseq.optim.fp16_optimizer import FP16Optimizer, MemoryEfficientFP16Optimizer

HALF_OPTIMIZERS = (FP16Optimizer, MemoryEfficientFP16Optimizer, AMPOptimizer)


@dataclass
class AutocastBF16Config:
    autocast_bf16: bool = field(
        default=False,
        metadata={
            "help": "train under torch.autocast(bfloat16) with float32 weights (fairseq's --bf16 makes the weights "
            "bfloat16, its --amp autocasts to float16); not with --fp16, --bf16 or --amp"
        },
    )


class AutocastBF16Hooks:
    """The task's ``train_step`` under ``--autocast-bf16``; mixed in directly before ``FairseqTask``, whose
    ``train_step`` it replaces then: fairseq's opens ``torch.cuda.amp.autocast(enabled=<--amp>)``, which would turn a
    surrounding bfloat16 region off again."""

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if not getattr(self.cfg, "autocast_bf16", False):
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        if isinstance(optimizer, HALF_OPTIMIZERS):
            raise ValueError(
                "--autocast-bf16 keeps float32 weights and autocasts to bfloat16 itself: leave out --fp16, --bf16, "
                f"--memory-efficient-fp16/-bf16 and --amp (the optimizer is fairseq's {type(optimizer).__name__})"
            )
        model.train()
        model.set_num_updates(update_num)
        device_type = next(model.parameters()).device.type
        with torch.autograd.profiler.record_function("forward"):
            with torch.autocast(device_type, dtype=torch.bfloat16):
                loss, sample_size, logging_output = criterion(model, sample)
        if ignore_grad:
            loss *= 0
        with torch.autograd.profiler.record_function("backward"):
            optimizer.backward(loss)
        return loss, sample_size, logging_output
