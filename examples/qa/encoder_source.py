"""Which Hugging Face encoder the folders of examples/qa/cpu_pretrained.sh's --out were made from.

    python examples/qa/encoder_source.py check-hf ENCODER HF_DIR    # may ENCODER (an earlier import) serve --hf HF_DIR?
    python examples/qa/encoder_source.py made-from ENCODER FOLDER [--dry-run]
    python examples/qa/encoder_source.py check-layers HF_DIR LONG_RANGE_LAYERS KIND  # would the run build them?

The import (ENCODER/hf_import.json) records its source directory and the SHA-256 of its weights. ``check-hf`` accepts
HF_DIR when its weights file has that SHA-256 (the same model, also when moved, e.g. in a rebuilt environment), and
otherwise stops: the data and runs in --out were made from the other model. ``made-from`` does the same for a folder
made from ENCODER (the tokenised SQuAD data, a fine-tuning run): FOLDER/encoder_source.json records the encoder it
was made from; a folder recorded with another encoder is refused, one without a record (made before the recipe
kept them) gets the current encoder's. ``check-layers`` applies the QA model's own checks: KIND against the choices
of --long-range-layer, and --long-range-layers against the encoder's layer count (HF_DIR/config.json;
all-MiniLM-L6-v2's 6 in a dry run before its wheel is installed), so that a dry run refuses what the run would. Exit
status 2 and a message naming the folders and both models, or the setting, on refusal.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import NoReturn

PROG = "examples/qa/cpu_pretrained.sh"
RECORD = "encoder_source.json"


def refuse(message: str) -> NoReturn:
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(2)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def encoder_identity(encoder: Path) -> dict:
    """Source directory, weights file and weights SHA-256 of an import, from its hf_import.json."""
    info_file = encoder / "hf_import.json"
    try:
        info = json.loads(info_file.read_text(encoding="utf-8"))
        return {key: info[key] for key in ("source", "weights_file", "weights_sha256")}
    except (OSError, ValueError, KeyError) as error:
        refuse(
            f"{encoder} holds model.pt but no readable {info_file.name} ({error}), so which model it was imported "
            f"from is unknown: give another --out, or remove {encoder} to import again"
        )


def describe(identity: dict) -> str:
    return f"{identity['source']} ({identity['weights_file']} sha256 {identity['weights_sha256'][:12]})"


def check_hf(encoder: Path, hf_dir: Path) -> None:
    identity = encoder_identity(encoder)
    weights = hf_dir / identity["weights_file"]
    if weights.is_file() and file_sha256(weights) == identity["weights_sha256"]:
        return
    found = f"its {weights.name} has other weights" if weights.is_file() else f"it holds no {weights.name}"
    refuse(
        f"--hf {hf_dir}: --out {encoder.parent} already holds an encoder imported from {describe(identity)}, and "
        f"{found}; the data and runs in {encoder.parent} were made from that encoder. Give another --out for "
        f"{hf_dir}, or --hf {identity['source']} to go on with the earlier one"
    )


def made_from(encoder: Path, folder: Path, dry_run: bool) -> None:
    identity = encoder_identity(encoder)
    record = folder / RECORD
    if record.is_file():
        try:
            recorded = json.loads(record.read_text(encoding="utf-8"))
            if recorded["weights_sha256"] == identity["weights_sha256"]:
                return
        except (OSError, ValueError, KeyError, TypeError) as error:
            refuse(f"{record}: unreadable ({error!r}); remove {folder} to make it again from {encoder}")
        refuse(
            f"{folder} was made from the encoder imported from {describe(recorded)}, but {encoder} now holds the one "
            f"from {describe(identity)}: give another --out, or remove {folder} to make it again from the new encoder"
        )
    if not dry_run:
        folder.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(identity, indent=1) + "\n", encoding="utf-8")


def check_layers(hf_dir: Path, layers: str, kind: str) -> None:
    from fairseq_clusterformer.layers.kinds import long_range_choices
    from fairseq_clusterformer.layers.settings import check_choice, parse_layer_list
    from fairseq_clusterformer.qa.encoder import check_first_layer

    try:  # the choices of the QA model's --long-range-layer
        check_choice("--long-range-layer", kind, long_range_choices())
    except ValueError as err:
        refuse(f"KIND={kind}: {err}")

    config = hf_dir / "config.json"
    # transformers' BERT and RoBERTa configs default to 12 layers
    count = json.loads(config.read_text(encoding="utf-8")).get("num_hidden_layers", 12) if config.is_file() else 6
    try:
        check_first_layer(parse_layer_list(layers, count), kind)
    except ValueError as err:
        source = config if config.is_file() else "all-MiniLM-L6-v2"
        refuse(f"LONG_RANGE_LAYERS={layers} (KIND={kind}) for the encoder's {count} layers ({source}): {err}")


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[0] == "check-hf":
        check_hf(Path(argv[1]), Path(argv[2]))
    elif len(argv) in (3, 4) and argv[0] == "made-from" and argv[3:] in ([], ["--dry-run"]):
        made_from(Path(argv[1]), Path(argv[2]), dry_run=len(argv) == 4)
    elif len(argv) == 4 and argv[0] == "check-layers":
        check_layers(Path(argv[1]), argv[2], argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
