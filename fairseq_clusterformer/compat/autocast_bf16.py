"""``--autocast-bf16``: training under ``torch.autocast`` in bfloat16, which fairseq 0.12 has no flag for.

fairseq's ``--bf16`` converts the model itself to bfloat16 (its TPU path: bfloat16 weights, layer norms and softmax)
and ``--amp`` autocasts to float16 behind a loss scaler (``FairseqTask.train_step`` opens
``torch.cuda.amp.autocast``, whose dtype is float16). With ``--autocast-bf16`` the training forward pass, model and
criterion, runs under ``torch.autocast(<the model's device type>, dtype=torch.bfloat16)``: matrix products and
attention in bfloat16; layer norms, softmax and the loss in float32 (autocast's own lists); weights, gradients and
Adam's moments stay float32 and no loss scale is needed (bfloat16 has float32's exponent range). Outside training
the flag runs the model's layer stack under the same autocast (``set_bf16_layers``): validation, ``fairseq-eval-lm
--task clusterformer_lm --autocast-bf16``, and the QA scripts' own ``--autocast-bf16``; embeddings, the last layer
norm, output projections, heads and losses stay float32. It works on a CPU too (``torch.autocast("cpu")`` takes
bfloat16), but pays only where the processor multiplies bfloat16 natively. Elsewhere ``--bf16-products auto`` (the
default) runs the bfloat16 products through float32 kernels at bfloat16's rounding points (``ops/bf16_products.py``):
the run keeps bfloat16's numerics at float32's speed instead of going 10 times slower; ``warn_if_bf16_is_slow``
measures both rates and says which case this is. A resume whose flag differs from the checkpoint's
(``warn_precision_change``) is said, naming the file and both precisions: the run goes on in the precision the
command line asks for.

No ``from __future__ import annotations`` here: fairseq reads the config field types at run time.
"""

import logging
import sys
from dataclasses import dataclass, field

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.optim.amp_optimizer import AMPOptimizer
from fairseq.optim.fp16_optimizer import FP16Optimizer, MemoryEfficientFP16Optimizer
from torch import nn

from fairseq_clusterformer.checkpoints.model_fit import saved_task_setting
from fairseq_clusterformer.checkpoints.run_files import checkpoint_files_to_load, root_config
from fairseq_clusterformer.ops.precision import (
    BF16_PRODUCTS,
    bf16_is_slower,
    bf16_products,
    measured_rates,
    products_through_float32,
    set_bf16_products,
)

logger = logging.getLogger(__name__)

HALF_OPTIMIZERS = (FP16Optimizer, MemoryEfficientFP16Optimizer, AMPOptimizer)
# fairseq's own half-precision flags (its ``common`` group), which --autocast-bf16 replaces
HALF_FLAGS = ("fp16", "bf16", "memory_efficient_fp16", "memory_efficient_bf16", "amp")


@dataclass
class AutocastBF16Config:
    autocast_bf16: bool = field(
        default=False,
        metadata={
            "help": "run the layers under torch.autocast(bfloat16) with float32 weights, in training, validation and "
            "fairseq-eval-lm (fairseq's --bf16 makes the weights bfloat16, its --amp autocasts to float16); not with "
            "--fp16, --bf16 or --amp"
        },
    )
    bf16_products: ChoiceEnum(BF16_PRODUCTS) = field(
        default="auto",
        metadata={
            "help": "how --autocast-bf16 multiplies on a CPU: 'auto' through float32 kernels at bfloat16's rounding "
            "points where the CPU has no native bfloat16 (its own bfloat16 kernels run 10-100x slower there), "
            "'native' always torch's bfloat16 kernels, 'float32' always float32's"
        },
    )


def warn_if_bf16_is_slow(device_type: str, flag: str = "--autocast-bf16") -> tuple[float, float]:
    """Measure this device's float32 and bfloat16 matmul rates (once a process) and say which kind of device it is:
    on a CPU without native bfloat16 (no AVX512-BF16 / AMX) the products go through float32 kernels
    (``--bf16-products auto``), or, where a command asked for torch's own kernels, the run is warned, naming both
    rates, that it goes many times slower. Returns (float32, bfloat16) GFLOP/s."""
    seen = device_type in _SAID
    fp32, bf16 = measured_rates(device_type)
    _SAID.add(device_type)
    if seen:
        return fp32, bf16
    rates = f"bfloat16 at {bf16:.0f} GFLOP/s and float32 at {fp32:.0f} GFLOP/s (512 x 512 products)"
    if not bf16_is_slower(fp32, bf16):
        logger.info(f"{flag}: bfloat16 matmul {bf16:.0f} GFLOP/s, float32 {fp32:.0f} GFLOP/s on this {device_type}")
    elif products_through_float32(device_type):
        logger.info(
            f"{flag}: this {device_type.upper()} multiplies {rates}: it has no native bfloat16, so the bfloat16 "
            "products run through float32 kernels at bfloat16's rounding points (--bf16-products auto): bfloat16's "
            "numerics at float32's speed, not faster"
        )
    else:
        logger.warning(
            f"{flag}: this {device_type.upper()} multiplies {rates}: it has no native bfloat16, so torch's own "
            f"bfloat16 kernels make the run slower, not faster; leave {flag} out on this machine, or let "
            "--bf16-products auto run the products through float32 kernels"
        )
    return fp32, bf16


_SAID: set[str] = set()


def set_bf16_layers(model: nn.Module, enabled: bool = True) -> None:
    """Run ``model``'s layer stack under bfloat16 autocast outside training too (the LM decoder's and the QA
    encoder's ``bf16_layers``); refuses a model that has no such stack."""
    stacks = [module for module in model.modules() if hasattr(module, "bf16_layers")]
    if not stacks:
        raise ValueError(f"--autocast-bf16: {type(model).__name__} has no layer stack that can run in bfloat16")
    for module in stacks:
        module.bf16_layers = enabled


def _precision(autocast: bool) -> str:
    return "bfloat16 layers (--autocast-bf16)" if autocast else "float32 (no --autocast-bf16)"


def warn_precision_change(task_cfg, autocast: bool) -> None:
    """Warn, naming the file and both precisions, when the checkpoint this run resumes from was trained with another
    --autocast-bf16 than the command line's: the resumed run, and the checkpoints it writes, take the command line's."""
    for flag, path in checkpoint_files_to_load(task_cfg):
        saved = saved_task_setting(path, "autocast_bf16")
        if saved is not None and bool(saved) != autocast:
            logger.warning(
                f"{flag} {path} was trained in {_precision(bool(saved))}; this run goes on in {_precision(autocast)}"
                f", and so will the checkpoints it writes; {'leave out' if autocast else 'add'} --autocast-bf16 to "
                "keep the checkpoint's precision"
            )


def check_no_half_flags(task_cfg, argv: list[str]) -> None:
    """Refuse, naming both flags, fairseq's half precision beside --autocast-bf16 on the command line ``argv`` when
    the task is set up: later, fairseq's own set-up fails first on a CPU (--fp16's optimizer asks CUDA, --bf16 a
    TPU) and fairseq-eval-lm --fp16 halves the model into a raw torch error. Only flags of this command line count:
    a checkpoint trained with --fp16 may still be scored with a script's --autocast-bf16."""
    root = root_config(task_cfg)
    common = getattr(root, "common", None) if root is not None else task_cfg  # a Namespace holds every flag
    flags = {name: f"--{name.replace('_', '-')}" for name in HALF_FLAGS}
    given = [flag for name, flag in flags.items() if getattr(common, name, False) and flag in argv]
    if given:
        raise ValueError(
            f"--autocast-bf16 with {', '.join(given)}: give one or the other (--autocast-bf16 keeps float32 weights "
            "and autocasts to bfloat16 itself; fairseq's half-precision flags convert the model or its training)"
        )


def explain_flag_outside_its_tasks(argv: list[str]) -> None:
    """A fairseq console script given --autocast-bf16 with a task that lacks it (fairseq-train's default task is
    translation) ends on argparse's bare "unrecognized arguments: --autocast-bf16"; this says, just before, which
    tasks have the flag. Called as --user-dir imports the package, before fairseq parses the command line."""
    from fairseq.tasks import TASK_REGISTRY

    script = argv[0].rsplit("/", 1)[-1] if argv else ""
    if "--autocast-bf16" not in argv or not script.startswith("fairseq-") or script.startswith("fairseq-clusterformer"):
        return
    ours = sorted(name for name, task in TASK_REGISTRY.items() if issubclass(task, AutocastBF16Hooks))
    given = [arg.partition("=")[2] or (argv[i + 1] if i + 1 < len(argv) else "") for i, arg in enumerate(argv)
             if arg == "--task" or arg.startswith("--task=")]  # fmt: skip
    if given and given[-1] in ours:
        return
    task = f"--task {given[-1]}" if given else "no --task (fairseq's default task)"
    print(f"{script}: --autocast-bf16 is a flag of {' and '.join(f'--task {name}' for name in ours)}; this command "
          f"line gives {task}", file=sys.stderr)  # fmt: skip


def default_device_type() -> str:
    """Where a model built now will most likely run: fairseq moves it to CUDA when there is one (``--cpu`` aside)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def flag_of(task) -> bool:
    """The task's --autocast-bf16: in ``cfg`` for a dataclass task (QA), in ``args`` for a legacy one (fairseq's
    LanguageModelingTask, under the LM task), whose ``cfg`` is None."""
    cfg = task.cfg if getattr(task, "cfg", None) is not None else getattr(task, "args", None)
    return bool(getattr(cfg, "autocast_bf16", False))


class AutocastBF16Hooks:
    """The task's ``train_step`` under ``--autocast-bf16``; mixed in directly before ``FairseqTask``, whose
    ``train_step`` it replaces then: fairseq's opens ``torch.cuda.amp.autocast(enabled=<--amp>)``, which would turn a
    surrounding bfloat16 region off again."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if flag_of(self):
            task_cfg = self.cfg if getattr(self, "cfg", None) is not None else self.args
            check_no_half_flags(task_cfg, sys.argv)
            set_bf16_products(str(getattr(task_cfg, "bf16_products", "auto")))  # a checkpoint may predate it

    def build_model(self, cfg, from_checkpoint=False):
        """With the flag, the model's layers run in bfloat16 outside training too (validation, fairseq-eval-lm)."""
        model = super().build_model(cfg, from_checkpoint)
        task_cfg = getattr(self, "cfg", None) or getattr(self, "args", None)
        if not from_checkpoint and task_cfg is not None:  # a training run, maybe a resume
            warn_precision_change(task_cfg, flag_of(self))
        if flag_of(self):
            warn_if_bf16_is_slow(default_device_type())
            set_bf16_layers(model)
        return model

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if not flag_of(self):
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        if isinstance(optimizer, HALF_OPTIMIZERS):
            raise ValueError(
                "--autocast-bf16 keeps float32 weights and autocasts to bfloat16 itself: leave out --fp16, --bf16, "
                f"--memory-efficient-fp16/-bf16 and --amp (the optimizer is fairseq's {type(optimizer).__name__})"
            )
        model.train()
        model.set_num_updates(update_num)
        device_type = next(model.parameters()).device.type
        if not getattr(self, "_autocast_announced", False):
            self._autocast_announced = True
            logger.info(f"--autocast-bf16: training forward passes under torch.autocast({device_type!r}, bfloat16)")
        with bf16_products(device_type):  # the backward pass's products too
            with torch.autograd.profiler.record_function("forward"):
                with torch.autocast(device_type, dtype=torch.bfloat16):
                    loss, sample_size, logging_output = criterion(model, sample)
            if ignore_grad:
                loss *= 0
            with torch.autograd.profiler.record_function("backward"):
                optimizer.backward(loss)
        return loss, sample_size, logging_output
