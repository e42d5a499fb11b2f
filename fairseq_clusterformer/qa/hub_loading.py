"""Loading a clusterformer_qa checkpoint for the hub interface (``ClusterFormerQAModel.from_pretrained``): the
checkpoint, its data folder (``dict.txt`` and ``qa_config.json``), and the tokeniser the data was binarised with.

fairseq's hub convention: ``from_pretrained(model_dir, checkpoint_file, data_name_or_path)``, a
``data_name_or_path`` starting with "." being relative to ``model_dir``. Without one, the data folder is the one the
checkpoint was trained on if it is still there, else ``model_dir`` (a checkpoint copied or shared together with its
``dict.txt``, ``qa_config.json`` and tokeniser files). The tokeniser's files are looked for where ``qa_config.json``
records them, then beside the data and beside the checkpoint (``locate_tokenizer_files``): the recorded paths are
those of the machine that binarised the data.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from omegaconf import open_dict

from fairseq_clusterformer.checkpoints.model_fit import checkpoint_arch
from fairseq_clusterformer.compat.autocast_bf16 import set_bf16_layers, warn_if_bf16_is_slow
from fairseq_clusterformer.layers.centroid_check import naming_checkpoint
from fairseq_clusterformer.qa.data.binarized import CONFIG, load_config
from fairseq_clusterformer.qa.data.tokenizers import PARAGRAPH_TOKEN, build_tokenizer, locate_tokenizer_files
from fairseq_clusterformer.qa.hub import ClusterFormerQAHubInterface
from fairseq_clusterformer.qa.task import ClusterFormerQATask

# the task settings a caller may change for inference (keyword arguments of from_pretrained)
INFERENCE_OVERRIDES = ("max_context_eval", "max_answer_tokens")


# a run's checkpoint when none is named: the best, else the last (a run that does not validate, as the CPU recipes,
# writes no checkpoint_best.pt)
DEFAULT_CHECKPOINTS = ("checkpoint_best.pt", "checkpoint_last.pt")


def checkpoint_path(model_name_or_path: str, checkpoint_file: str | None = None) -> tuple[str, str]:
    """(checkpoint file, its folder): ``model_name_or_path`` is the folder, or the checkpoint file itself."""
    if os.path.isfile(model_name_or_path):
        return model_name_or_path, os.path.dirname(os.path.abspath(model_name_or_path))
    names = DEFAULT_CHECKPOINTS if checkpoint_file is None else (checkpoint_file,)
    paths = [os.path.join(model_name_or_path, name) for name in names]
    for path in paths:
        if os.path.isfile(path):
            return path, os.path.abspath(model_name_or_path)
    raise FileNotFoundError(
        f"no checkpoint {' or '.join(paths)} (model_name_or_path {model_name_or_path!r}, checkpoint_file)"
    )


class NotAQACheckpoint(ValueError):
    """A checkpoint of another model (a language model, ...) given where a clusterformer_qa one is needed."""


def check_qa_checkpoint(state: dict[str, Any], path: str) -> None:
    """ValueError naming the file, its --arch and --task, unless it holds a clusterformer_qa model."""
    arch, task = checkpoint_arch(state)
    model = ARCH_MODEL_REGISTRY.get(arch)
    # the class by its registered name: qa/model.py's from_pretrained imports this module, so it cannot import that
    if model is None or not issubclass(model, MODEL_REGISTRY["clusterformer_qa"]):
        raise NotAQACheckpoint(
            f"{path} is not a question-answering checkpoint (--arch {arch}, --task {task}); the QA hub needs a "
            "clusterformer_qa checkpoint (trained with --task clusterformer_qa)"
        )


def is_data_folder(path: str | None) -> bool:
    return bool(path) and all(os.path.isfile(os.path.join(path, name)) for name in ("dict.txt", CONFIG))


def data_folder(recorded: str | None, model_dir: str, data_name_or_path: str | None) -> str:
    """The folder holding the checkpoint's ``dict.txt`` and ``qa_config.json`` (see the module's docstring)."""
    if data_name_or_path:
        given = data_name_or_path
        if given.startswith("."):  # fairseq's hub convention: relative to the model folder
            given = os.path.join(model_dir, given)
        if not is_data_folder(given):
            raise FileNotFoundError(
                f"data_name_or_path {data_name_or_path!r}: {given} holds no dict.txt and {CONFIG}; give the folder "
                "written by fairseq-clusterformer-qa-binarize for the checkpoint's training"
            )
        return os.path.abspath(given)
    tried = [p for p in (recorded, model_dir) if p]
    for folder in tried:
        if is_data_folder(folder):
            return os.path.abspath(folder)
    raise FileNotFoundError(
        f"no data folder with dict.txt and {CONFIG} at {' or '.join(tried)} (the checkpoint's training data, then "
        "the checkpoint's folder): give data_name_or_path (--data), or copy those files beside the checkpoint"
    )


def load_hub(
    model_name_or_path: str,
    checkpoint_file: str | None = None,
    data_name_or_path: str | None = None,
    cpu: bool = False,
    autocast_bf16: bool = False,
    **overrides: Any,
) -> ClusterFormerQAHubInterface:
    """The hub interface of a clusterformer_qa checkpoint, in evaluation mode, on the GPU when there is one and
    ``cpu`` is False; its layers in float32 whatever precision it was trained in, under bfloat16 autocast with
    ``autocast_bf16`` (as qa-predict's --autocast-bf16). ``overrides``: ``max_context_eval`` (the longest context
    read, in tokens) and ``max_answer_tokens`` (the longest answer) instead of the checkpoint's task settings."""
    unknown = sorted(set(overrides) - set(INFERENCE_OVERRIDES))
    if unknown:
        raise TypeError(f"from_pretrained: unknown setting(s) {', '.join(unknown)} (known: {INFERENCE_OVERRIDES})")
    path, model_dir = checkpoint_path(model_name_or_path, checkpoint_file)
    given = {key: value for key, value in overrides.items() if value is not None}
    # the trained weights replace any pretrained ones: the RoBERTa the training started from is not read
    device_type = "cuda" if torch.cuda.is_available() and not cpu else "cpu"
    if autocast_bf16:
        warn_if_bf16_is_slow(device_type)
    # the task's build_model sets the layers' precision from the config: the caller's, not the training's; how the
    # products run is this machine's choice (bf16_products), not the training machine's
    state = checkpoint_utils.load_checkpoint_to_cpu(
        path, {"roberta_path": None, "autocast_bf16": autocast_bf16, "bf16_products": "auto", **given}
    )
    check_qa_checkpoint(state, path)
    cfg = state["cfg"]
    data_dir = data_folder(getattr(cfg.task, "data", None), model_dir, data_name_or_path)
    with open_dict(cfg):
        cfg.task.data = data_dir
    dictionary = Dictionary.load(os.path.join(data_dir, "dict.txt"))
    # the NQ heads come with the weights, whether or not the data folder still holds a split that says so
    answer_types = any(key.startswith("qa_heads.answer_type.") for key in state["model"])
    task = ClusterFormerQATask(cfg.task, dictionary, answer_types)
    with naming_checkpoint(path):
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], task=task, state=state)
    config = load_config(data_dir)
    if config.get("paragraph_token", PARAGRAPH_TOKEN) != PARAGRAPH_TOKEN:
        raise ValueError(f"{data_dir}/{CONFIG}: paragraph token {config['paragraph_token']!r}, not {PARAGRAPH_TOKEN}")
    tokenizer = build_tokenizer(locate_tokenizer_files(config, [data_dir, model_dir]), dictionary)
    set_bf16_layers(models[0], autocast_bf16)  # also for a saved config that predates the flag
    hub = ClusterFormerQAHubInterface(cfg, task, models[0], tokenizer)
    if device_type == "cuda":
        hub.cuda()
    return hub.eval()
