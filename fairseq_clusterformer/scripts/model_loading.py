"""Loading a checkpoint for a console script: which kind of model it holds, read before its task and model are built.

A console script given a checkpoint of the wrong kind otherwise fails far from the cause: a language model given to
the QA prediction script is blamed on the data's dictionary, a QA model given to an LM tool on the data folder, a
``transformer_lm`` given to the cluster inspector with an AttributeError deep inside the decoder. ``load_checkpoint``
reads the file once, checks the kind, and returns what ``load_model_ensemble_and_task(state=...)`` takes;
``load_model`` goes on to the model in evaluation mode, on the GPU when there is one.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from fairseq import checkpoint_utils
from fairseq.models import ARCH_MODEL_REGISTRY, FairseqLanguageModel

from fairseq_clusterformer.checkpoints.model_fit import checkpoint_arch
from fairseq_clusterformer.compat.autocast_bf16 import set_bf16_layers, warn_if_bf16_is_slow
from fairseq_clusterformer.layers.centroid_check import naming_checkpoint


def describe_kind(arch: str | None) -> str:
    """What a user calls the checkpoint of an architecture: "a question-answering (clusterformer_qa) checkpoint"."""
    model = ARCH_MODEL_REGISTRY.get(arch)
    if model is None:
        return "a checkpoint of an architecture not registered here"
    # the plug-in's models say what they are: this module, shared by the LM and QA scripts, imports neither
    kind = getattr(model, "checkpoint_kind", None)
    if kind is not None:
        return kind
    if issubclass(model, FairseqLanguageModel):
        return "a language-model checkpoint"
    return f"a {model.__name__} checkpoint"


def check_kind(state: dict[str, Any], path: str | os.PathLike, wanted: type, needed: str, flag: str = "--path") -> None:
    """Raise ValueError naming ``flag``, the file, its arch and task, unless its model is a ``wanted``; ``needed``
    says what the tool takes instead ("fairseq-clusterformer-qa-predict needs a clusterformer_qa checkpoint")."""
    arch, task = checkpoint_arch(state)
    model = ARCH_MODEL_REGISTRY.get(arch)
    if model is not None and issubclass(model, wanted):
        return
    raise ValueError(f"{flag} {path} is {describe_kind(arch)} (--arch {arch}, --task {task}); {needed}")


def load_checkpoint(
    path: str | os.PathLike, arg_overrides: dict[str, Any], wanted: type, needed: str, flag: str = "--path"
) -> dict[str, Any]:
    """The checkpoint's state, with ``arg_overrides`` applied, once its model is known to be a ``wanted``."""
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path), arg_overrides)
    check_kind(state, path, wanted, needed, flag)
    return state


def load_model(
    path: str | os.PathLike,
    arg_overrides: dict[str, Any],
    wanted: type,
    needed: str,
    cpu: bool = False,
    bf16: bool = False,
) -> tuple[Any, Any, Any]:
    """(model in eval mode, cfg, task) of a checkpoint that holds a ``wanted``; on CUDA unless ``cpu`` or none is
    there; its layers under bfloat16 autocast with ``bf16`` (a script's ``--autocast-bf16``), in float32 otherwise,
    whatever precision it was trained in. Raises ValueError as ``load_checkpoint`` does."""
    # the task's build_model sets the layers' precision; how the products run is this machine's choice, not the
    # training machine's
    arg_overrides = {**arg_overrides, "autocast_bf16": bf16, "bf16_products": "auto"}
    if bf16:
        warn_if_bf16_is_slow("cuda" if torch.cuda.is_available() and not cpu else "cpu")
    state = load_checkpoint(path, arg_overrides, wanted, needed)
    with naming_checkpoint(path):
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides, state=state)
    model = models[0].eval()
    if bf16:  # also for a checkpoint whose saved config predates the flag (the override above then sets nothing)
        set_bf16_layers(model)
    if torch.cuda.is_available() and not cpu:
        model.cuda()
    return model, cfg, task
