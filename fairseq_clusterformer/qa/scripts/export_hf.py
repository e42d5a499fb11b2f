"""fairseq-clusterformer-export-hf: a trained clusterformer_qa checkpoint -> a folder transformers loads.

    fairseq-clusterformer-export-hf CHECKPOINT OUT_DIR [--data DIR]

OUT_DIR gets config.json, model.safetensors, clusterformer_qa.py, tokenizer.json, tokenizer_config.json and a model
card (README.md), written under temporary names and renamed together once all are complete
(``qa/hf_model/export.py``; docs/hf_export.md). The checkpoint's data folder (dict.txt, qa_config.json) and tokeniser
are found as ``fairseq-clusterformer-qa-ask`` finds them, ``--data`` to name the folder. OUT_DIR must be new, empty,
or an earlier export's: the export never writes over files it did not create. Only a model whose data was tokenised
by a Hugging Face import's tokeniser (``--tokenizer hf``) exports.
"""

from __future__ import annotations

import argparse
import logging
import os

from fairseq_clusterformer.qa.hf_model.export import export_hf
from fairseq_clusterformer.scripts.cli_logging import log_like_fairseq, run_cli

logger = logging.getLogger("fairseq_clusterformer.export_hf")


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairseq-clusterformer-export-hf", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="clusterformer_qa checkpoint (or its folder)")
    parser.add_argument("out", metavar="OUT_DIR", help="output folder (created if missing)")
    parser.add_argument("--data", help="the checkpoint's data folder (default: found as qa-ask finds it)")
    return parser


def main(args: argparse.Namespace):
    log_like_fairseq()
    if not os.path.exists(args.checkpoint):
        raise FileNotFoundError(f"CHECKPOINT {args.checkpoint}: no such file")
    config = export_hf(args.checkpoint, args.out, args.data)
    logger.info(
        f"exported {args.checkpoint} to {args.out}: {config.num_hidden_layers} layers, long-range "
        f"{config.long_range_layer} ({config.long_range_mode}) at {config.long_range_layers or '-'}, contexts up to "
        f"{config.max_context_tokens} tokens"
    )
    return config


def cli_main() -> None:
    run_cli(main, get_parser())


if __name__ == "__main__":
    cli_main()
