"""fairseq-clusterformer-import-hf: a Hugging Face BERT or RoBERTa encoder directory -> what --roberta-path loads.

    fairseq-clusterformer-import-hf SRC_DIR OUT_DIR

SRC_DIR holds config.json, model.safetensors (or pytorch_model.bin) and the tokenizer (tokenizer.json, or vocab.txt
for BERT, or vocab.json + merges.txt for RoBERTa, with tokenizer_config.json's settings). OUT_DIR gets:
- model.pt: the encoder as a fairseq RoBERTa state dict (every weight mapped, see qa/hf/weights.py);
- dict.txt: the dictionary, whose symbols are the source's token ids (see qa/hf/vocab.py);
- tokenizer.json: the source's fast tokenizer (without batch truncation or padding);
- hf_import.json: where it came from and the encoder arguments (layer-norm epsilon, token types, activation,
  positions, sizes) that ``--roberta-path OUT_DIR`` sets for the QA model.
Files are written under temporary names and renamed together once all of them are complete.

The import never writes over a file it did not create: OUT_DIR may not be SRC_DIR or a folder inside it (symbolic
links resolved), and an existing OUT_DIR may hold any of the four files only when it is an earlier import's output
(it has that import's hf_import.json), whose files a new import replaces.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import torch

from fairseq_clusterformer.atomic_files import atomic_group
from fairseq_clusterformer.qa.hf import vocab as hf_vocab
from fairseq_clusterformer.qa.hf.weights import (
    HFImportError,
    convert_weights,
    encoder_args,
    read_config,
    read_weights,
    sha256,
    weights_file,
)
from fairseq_clusterformer.scripts.cli_logging import log_like_fairseq, run_cli

logger = logging.getLogger("fairseq_clusterformer.import_hf")

IMPORT_INFO = "hf_import.json"
OUTPUT_FILES = ("model.pt", "dict.txt", "tokenizer.json", IMPORT_INFO)


def is_import_record(path: str) -> bool:
    """Whether ``path`` is an hf_import.json that this script wrote (a JSON object with its fields)."""
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and {"source", "weights_sha256", "encoder_args"} <= info.keys()


def check_output(src: str, out: str) -> None:
    """Refuse an OUT_DIR whose writing would replace a file that no import created, before anything is read."""
    real_src, real_out = os.path.realpath(src), os.path.realpath(out)
    if os.path.commonpath([real_src, real_out]) == real_src:
        where = "is" if real_out == real_src else "is inside"
        raise HFImportError(
            f"OUT_DIR {out} {where} SRC_DIR {src} ({real_out}): the import would write {', '.join(OUTPUT_FILES)} "
            "among the source model's files (replacing its own tokenizer.json); give an OUT_DIR outside SRC_DIR"
        )
    if os.path.lexists(out) and not os.path.isdir(out):
        raise HFImportError(f"OUT_DIR {out} is a file, not a directory")
    present = [name for name in OUTPUT_FILES if os.path.lexists(os.path.join(out, name))]
    if present and not is_import_record(os.path.join(out, IMPORT_INFO)):
        raise HFImportError(
            f"OUT_DIR {out} holds {', '.join(present)} that no earlier import wrote (no {IMPORT_INFO} of one): the "
            "import does not write over files it did not create; give a new or empty OUT_DIR, or an earlier "
            "import's"
        )


def fairseq_checkpoint(state: dict, info: dict) -> dict:
    """The smallest checkpoint that fairseq's ``load_checkpoint_to_cpu`` (and its upgrades) reads as it is."""
    history = {"criterion_name": "none", "optimizer_name": "none", "lr_scheduler_state": {}, "num_updates": 0}
    return {
        "model": state,
        "args": None,
        "cfg": None,
        "optimizer_history": [history],
        "last_optimizer_state": None,
        "extra_state": {"train_iterator": None},
        "hf_import": info,
    }


def import_hf(src: str, out: str) -> dict:
    """Import ``src`` into ``out``; returns the contents of hf_import.json."""
    if not os.path.isdir(src):
        raise HFImportError(f"SRC_DIR {src}: no such directory")
    check_output(src, out)
    config = read_config(src)
    weights = weights_file(src)
    settings = hf_vocab.tokenizer_settings(src)
    specials = hf_vocab.special_tokens(config.model_type, settings)
    tokenizer = hf_vocab.build_tokenizer(src, config.model_type, settings, specials)
    vocab_file = hf_vocab.tokenizer_file(src)
    hf_vocab.check_vocab_size(tokenizer, config.vocab_size, vocab_file)
    ids = hf_vocab.special_ids(tokenizer, specials, vocab_file)
    order = hf_vocab.fairseq_order(config.vocab_size, ids, vocab_file)
    state, skipped = convert_weights(read_weights(weights), config, order, weights)
    info = {
        "model_type": config.model_type,
        "source": os.path.abspath(src),
        "weights_file": os.path.basename(weights),
        "weights_sha256": sha256(weights),
        "special_tokens": {symbol: [specials[symbol], ids[symbol]] for symbol in specials},
        "do_lower_case": hf_vocab.lower_cases(tokenizer, settings),
        "layer_norm_eps": config.eps,
        "type_vocab_size": config.types,
        "max_position_embeddings": config.positions,
        "hidden_act": config.hidden_act,
        "encoder_args": encoder_args(config),
        "skipped": skipped,
    }
    with atomic_group() as files:
        torch.save(fairseq_checkpoint(state, info), files.path(os.path.join(out, "model.pt")))
        with open(files.path(os.path.join(out, "dict.txt")), "w", encoding="utf-8") as f:
            f.writelines(hf_vocab.dictionary_lines(order))
        tokenizer.save(str(files.path(os.path.join(out, "tokenizer.json"))))
        with open(files.path(os.path.join(out, IMPORT_INFO)), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)
            f.write("\n")
    logger.info(
        f"imported {config.model_type} ({config.layers} layers, {config.channels} dims, {config.vocab_size} tokens) "
        f"from {src} into {out}; skipped: {sorted(skipped) or 'nothing'}"
    )
    return info


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-clusterformer-import-hf",
        description="Import a Hugging Face BERT or RoBERTa encoder for --roberta-path (model.pt, dict.txt, "
        "tokenizer.json, hf_import.json).",
    )
    parser.add_argument("src", metavar="SRC_DIR", help="Hugging Face model directory (config.json, weights, tokenizer)")
    parser.add_argument("out", metavar="OUT_DIR", help="output directory (created if missing)")
    return parser


def main(args: argparse.Namespace) -> dict:
    log_like_fairseq()
    return import_hf(args.src, args.out)


def cli_main() -> None:
    run_cli(main, get_parser())


if __name__ == "__main__":
    cli_main()
