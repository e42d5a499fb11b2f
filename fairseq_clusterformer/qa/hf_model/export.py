"""A trained clusterformer_qa checkpoint as a folder that transformers loads (``fairseq-clusterformer-export-hf``).

The folder (docs/hf_export.md): ``config.json`` (``ClusterFormerQAHFConfig``, with ``auto_map`` and
``custom_pipelines`` naming ``clusterformer_qa.py``), ``model.safetensors`` (every weight and buffer the fairseq model
saves, the centroids included, under ``clusterformer.``, and ``hf_to_fairseq``), ``clusterformer_qa.py`` (three
imports of this package's classes: the folder needs the package installed), the tokenizer (``tokenizer.json``,
``tokenizer_config.json``) and ``README.md``, the model card. The weights are taken from the model exactly as the
hub interface (``qa-ask``) loads it, so both compute the same logits.

Only a tokeniser of a Hugging Face import (``--tokenizer hf``) exports: its ``tokenizer.json`` is the model's
vocabulary as transformers reads it. GPT-2 BPE through fairseq's ``dict.txt`` and the package's sentencepiece
models have no such file, and converting them is not built; they are refused with that reason.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from fairseq import checkpoint_utils
from fairseq.models import ARCH_CONFIG_REGISTRY
from omegaconf import OmegaConf
from safetensors.torch import save_file
from tokenizers import Tokenizer, processors

from fairseq_clusterformer.atomic_files import atomic_group
from fairseq_clusterformer.qa.data.binarized import load_config
from fairseq_clusterformer.qa.hf.weights import sha256
from fairseq_clusterformer.qa.hf_model.card import model_card, recipe_scores, training_record
from fairseq_clusterformer.qa.hf_model.configuration import INFERENCE_ARGS, NAMED_ARGS, ClusterFormerQAHFConfig
from fairseq_clusterformer.qa.hf_model.modeling import ClusterFormerForQuestionAnswering
from fairseq_clusterformer.qa.hub_loading import check_qa_checkpoint, checkpoint_path, data_folder, load_hub
from fairseq_clusterformer.qa.model import ClusterFormerQAModel
from fairseq_clusterformer.qa.ops.windows import QUESTION_SPECIALS

REMOTE_CODE = "clusterformer_qa.py"
OUTPUT_FILES = ("config.json", "model.safetensors", REMOTE_CODE, "tokenizer.json", "tokenizer_config.json", "README.md")
SHIM = '''"""The clusterformer_qa classes, from the installed fairseq_clusterformer package (pip install it first)."""

from fairseq_clusterformer.qa.hf_model.configuration import ClusterFormerQAHFConfig  # noqa: F401
from fairseq_clusterformer.qa.hf_model.modeling import ClusterFormerForQuestionAnswering  # noqa: F401
from fairseq_clusterformer.qa.hf_model.pipeline import ClusterFormerQAPipeline  # noqa: F401
'''
AUTO_MAP = {
    "AutoConfig": "clusterformer_qa.ClusterFormerQAHFConfig",
    "AutoModelForQuestionAnswering": "clusterformer_qa.ClusterFormerForQuestionAnswering",
}
PIPELINES = {
    "question-answering": {
        "impl": "clusterformer_qa.ClusterFormerQAPipeline",
        "pt": ["AutoModelForQuestionAnswering"],
        "type": "text",
    }
}
TOKEN_FIELDS = {
    "<s>": "cls_token",
    "</s>": "sep_token",
    "<pad>": "pad_token",
    "<unk>": "unk_token",
    "<mask>": "mask_token",
}


class HFExportError(ValueError):
    """An input the export refuses; the message names it and why."""


def is_export(folder: str) -> bool:
    """Whether ``folder`` holds an earlier export's config.json (whose files a new export may replace)."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "clusterformer_qa" and "exported_from" in config


def check_output(out: str) -> None:
    """Refuse an OUT_DIR that is a file, or holds anything while not an earlier export, before any work."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise HFExportError(f"OUT_DIR {out} is a file, not a folder")
    if os.path.isdir(out) and os.listdir(out) and not is_export(out):
        held = sorted(os.listdir(out))
        raise HFExportError(
            f"OUT_DIR {out} holds {', '.join(held[:5])}{' ...' if len(held) > 5 else ''}, which no earlier export "
            "wrote (no clusterformer_qa config.json of one): the export never writes over files it did not create; "
            "give a new or empty folder, or an earlier export's"
        )


def load_checkpoint(path: str) -> dict:
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path, {"roberta_path": None})
    except Exception as e:  # a file torch cannot read: named with fairseq's or torch's reason
        raise HFExportError(f"CHECKPOINT {path} cannot be read as a fairseq checkpoint: {e}") from None
    try:
        check_qa_checkpoint(state, path)
    except ValueError as e:
        raise HFExportError(f"CHECKPOINT {e}") from None
    return state


def check_tokenizer(tokenizer_config: dict, data_dir: str) -> None:
    kind = tokenizer_config.get("tokenizer")
    if kind != "hf":
        raise HFExportError(
            f"{data_dir}/qa_config.json: the data was tokenised with the {kind!r} tokeniser, which does not export: "
            "only a Hugging Face import's tokeniser (--tokenizer hf) has the tokenizer.json transformers reads; "
            "GPT-2 BPE through fairseq's dict.txt and sentencepiece models would need a converted tokenizer.json "
            "with ids in the training dictionary's order, which this export does not build"
        )


def export_tokenizer(hub, paragraph_id: int) -> Tokenizer:
    """The imported tokenizer.json, untruncated, with the pair template ``<s> A </s></s> <p> B </s>``."""
    tokenizer = Tokenizer.from_str(hub.tokenizer.tokenizer.to_str())
    specials = hub.tokenizer.info["special_tokens"]  # fairseq symbol -> [token, HF id]
    (cls, cls_id), (sep, sep_id) = specials["<s>"], specials["</s>"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} {sep} <p>:1 $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id), ("<p>", paragraph_id)],
    )
    return tokenizer


def id_map(hub, size: int, paragraph_id: int) -> torch.Tensor:
    """Hugging Face id -> training dictionary index (-1: none), the paragraph token's included."""
    mapping = torch.full((size,), -1, dtype=torch.long)
    known = torch.from_numpy(hub.tokenizer.to_dict)
    mapping[: len(known)] = known
    mapping[paragraph_id] = hub.task.paragraph
    return mapping


def model_arguments(args) -> dict:
    """The checkpoint's model arguments that config.json keeps in ``fairseq_args``: the model's flags and what its
    architecture function fills in (a checkpoint's namespace also holds every training flag), JSON values only."""
    found = OmegaConf.to_container(args, resolve=True) if OmegaConf.is_config(args) else dict(vars(args))
    parser = argparse.ArgumentParser()
    ClusterFormerQAModel.add_args(parser)
    filled = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[found.get("arch") or found["_name"]](filled)
    model_args = {action.dest for action in parser._actions} | set(vars(filled)) | {"arch", "_name"}
    left_out = set(NAMED_ARGS.values()) | set(INFERENCE_ARGS)
    return {
        k: v
        for k, v in found.items()
        if k in model_args and k not in left_out and isinstance(v, (str, int, float, bool, type(None)))
    }


def build_config(hub, vocab_size: int, paragraph_id: int, origin: dict) -> ClusterFormerQAHFConfig:
    args, task = hub.model.args, hub.task
    specials = hub.tokenizer.info["special_tokens"]
    return ClusterFormerQAHFConfig(
        vocab_size=vocab_size,
        fairseq_vocab_size=hub.model.encoder.sentence_encoder.embed_tokens.num_embeddings,
        **{field: getattr(args, arg) for field, arg in NAMED_ARGS.items()},
        max_question_tokens=task.max_question_tokens,
        max_context_tokens=hub.max_context_tokens,
        max_answer_tokens=task.cfg.max_answer_tokens,
        answer_types=bool(task.answer_types),
        bos_token_id=specials["<s>"][1],
        pad_token_id=specials["<pad>"][1],
        eos_token_id=specials["</s>"][1],
        paragraph_token_id=paragraph_id,
        fairseq_args=model_arguments(args),
        architectures=["ClusterFormerForQuestionAnswering"],
        auto_map=AUTO_MAP,
        custom_pipelines=PIPELINES,
        exported_from=origin,
    )


def tokenizer_settings(hub, config: ClusterFormerQAHFConfig) -> dict:
    specials = hub.tokenizer.info["special_tokens"]
    longest = config.max_question_tokens + QUESTION_SPECIALS + config.max_context_tokens + 1
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{field: specials[symbol][0] for symbol, field in TOKEN_FIELDS.items() if symbol in specials},
        "model_max_length": longest,  # <s> question </s></s> context </s> at the model's limits
        "model_input_names": ["input_ids", "attention_mask"],
        "padding_side": "right",
        "truncation_side": "right",
        "do_lower_case": bool(hub.tokenizer.info.get("do_lower_case", False)),
        "clean_up_tokenization_spaces": False,
    }


def export_hf(checkpoint: str, out: str, data: str | None = None) -> ClusterFormerQAHFConfig:
    """Write the export of ``checkpoint`` (its data folder found as qa-ask finds it, or ``data``) into ``out``."""
    check_output(out)
    path, model_dir = checkpoint_path(checkpoint, "checkpoint_best.pt")
    state = load_checkpoint(path)
    data_dir = data_folder(getattr(state["cfg"].task, "data", None), model_dir, data)
    check_tokenizer(load_config(data_dir), data_dir)
    hub = load_hub(path, data_name_or_path=data_dir, cpu=True)
    paragraph_id = hub.tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    origin = {"checkpoint": os.path.abspath(path), "sha256": sha256(path), "data": data_dir, **training_record(state),
              "recipe_scores": recipe_scores(path)}  # fmt: skip
    config = build_config(hub, paragraph_id + 1, paragraph_id, origin)
    model = ClusterFormerForQuestionAnswering(config)
    model.clusterformer.load_state_dict(hub.model.state_dict(), strict=True)
    model.hf_to_fairseq.copy_(id_map(hub, config.vocab_size, paragraph_id))
    weights = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    with atomic_group() as files:
        config.to_json_file(files.path(os.path.join(out, "config.json")))
        save_file(weights, files.path(os.path.join(out, "model.safetensors")), metadata={"format": "pt"})
        files.path(os.path.join(out, REMOTE_CODE)).write_text(SHIM, encoding="utf-8")
        export_tokenizer(hub, paragraph_id).save(str(files.path(os.path.join(out, "tokenizer.json"))))
        settings = json.dumps(tokenizer_settings(hub, config), indent=2) + "\n"
        files.path(os.path.join(out, "tokenizer_config.json")).write_text(settings, encoding="utf-8")
        files.path(os.path.join(out, "README.md")).write_text(model_card(config), encoding="utf-8")
    return config
