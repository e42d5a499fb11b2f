"""Cut an imported encoder's vocabulary to the tokens that binarised QA data uses, and re-index that data.

    python -m benchmarks.qa_device.cut_vocab --encoder data-bin/minilm/encoder \
        --data squad_article=data-bin/minilm/squad_article/bin --out .qa-device/cut --half

V = dictionary rows, C = channels.

--encoder: a directory for ``--roberta-path`` (model.pt, dict.txt, hf_import.json; fairseq-clusterformer-import-hf).
--data NAME=DIR: a binarised QA directory (fairseq-clusterformer-qa-binarize --hf-dir of that encoder); repeatable,
  every one must share one dict.txt. The kept rows are the specials, the paragraph symbol and every id any split of
  any DIR holds; OUT/NAME gets the splits re-indexed to the cut dictionary (meta, texts and offsets copied as they
  are), OUT/encoder the encoder with those rows (and the <mask> row) only.
--half: store the encoder's floating-point weights as float16 (they load into float32 parameters).

On the data it was cut for, the cut model computes what the uncut one does: an embedding row is looked up by
symbol, no other weight depends on the vocabulary, and a row no input reaches gets no gradient (so Adam, weight
decay and gradient clipping treat the kept rows alike). What differs is the random start of the rows and heads the
pretrained model does not have (the paragraph symbol's row, the QA heads): fairseq draws them after the embedding
matrix, whose size changed. The re-indexed files are read back and checked to hold the same symbol sequences. The
cut encoder holds no tokenizer.json: it tokenises nothing new (a token outside the cut has no row).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from fairseq.data import Dictionary, indexed_dataset

from fairseq_clusterformer.atomic_files import AtomicFiles, atomic_group
from fairseq_clusterformer.qa.data.binarized import CONFIG, load_config
from fairseq_clusterformer.qa.hf.weights import sha256
from fairseq_clusterformer.qa.pretrained import EMBED_KEY, IMPORT_INFO
from fairseq_clusterformer.scripts.cli_logging import log_like_fairseq, run_cli

PARTS = ("question", "context")
INFO_KEY = "vocab_cut"


def data_arg(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or not name or "/" in name or not path:
        raise argparse.ArgumentTypeError(f"--data {value}: expected NAME=DIR (NAME a folder name)")
    return name, Path(path)


def splits_of(data_dir: Path) -> list[str]:
    splits = sorted(load_config(str(data_dir)).get("splits", {}))
    if not splits:
        raise ValueError(f"--data {data_dir}: its {CONFIG} lists no split")
    return splits


def split_ids(data_dir: Path, split: str, part: str) -> tuple[np.ndarray, np.ndarray]:
    """(every token id of the split's part, concatenated; the length of each item) straight from the .bin / .idx."""
    prefix = str(data_dir / f"{split}.{part}")
    if not indexed_dataset.MMapIndexedDataset.exists(prefix):
        raise ValueError(f"--data {data_dir}: {prefix}.bin / .idx not found")
    dataset = indexed_dataset.MMapIndexedDataset(prefix)
    sizes = np.asarray(dataset.sizes, dtype=np.int64)
    ids = np.frombuffer(dataset._bin_buffer, dtype=dataset._index.dtype, count=int(sizes.sum()))
    return ids.astype(np.int64), sizes


def kept_rows(data: dict[str, Path], dictionary: Dictionary) -> np.ndarray:
    """Ascending dictionary indices to keep: fairseq's specials, the paragraph symbol, every id the data holds."""
    used = np.zeros(len(dictionary), dtype=bool)
    used[: dictionary.nspecial] = True
    for data_dir in data.values():
        used[dictionary.index(load_config(str(data_dir)).get("paragraph_token", "<p>"))] = True
        for split in splits_of(data_dir):
            for part in PARTS:
                ids, _ = split_ids(data_dir, split, part)
                if ids.size and ids.max() >= len(dictionary):
                    raise ValueError(f"--data {data_dir}: {split}.{part} holds id {ids.max()} beyond its dict.txt")
                used[ids] = True
    return np.flatnonzero(used)


def cut_dictionary(dictionary: Dictionary, rows: np.ndarray) -> Dictionary:
    cut = Dictionary()  # fairseq's four specials, at the indices they hold in every dictionary
    for index in rows[dictionary.nspecial :]:
        cut.add_symbol(dictionary.symbols[index], n=dictionary.count[index])
    assert cut.symbols == [dictionary.symbols[i] for i in rows]
    return cut


def cut_encoder(encoder: Path, symbols: list[str], half: bool, files: AtomicFiles, out: Path) -> dict:
    """OUT/encoder: the embedding rows of ``symbols`` that the encoder has (and its <mask> row) in that order."""
    source = Dictionary.load(str(encoder / "dict.txt"))
    checkpoint = torch.load(encoder / "model.pt", map_location="cpu", weights_only=True)
    state = checkpoint["model"]
    embed = state[EMBED_KEY]  # V x C: the dictionary's rows, then <mask> (import-hf's order)
    if embed.size(0) not in (len(source), len(source) + 1):
        raise ValueError(f"--encoder {encoder}: {embed.size(0)} embedding rows for {len(source)} symbols in dict.txt")
    keep = [source.index(s) for s in symbols if s in source.indices] + list(range(len(source), embed.size(0)))
    state = {**state, EMBED_KEY: embed[keep].clone()}  # kept x C
    if half:
        state = {k: v.half() if v.is_floating_point() else v for k, v in state.items()}
    info = {
        "source": str(encoder.resolve()),
        "source_model_sha256": sha256(str(encoder / "model.pt")),
        "rows": len(keep),
        "source_rows": embed.size(0),
        "dtype": "float16" if half else str(embed.dtype).removeprefix("torch."),
    }
    import_info = json.loads((encoder / IMPORT_INFO).read_text(encoding="utf-8"))
    torch.save({**checkpoint, "model": state, INFO_KEY: info}, files.path(out / "model.pt"))
    cut = Dictionary()
    for symbol in symbols[source.nspecial :]:
        if symbol in source.indices:
            cut.add_symbol(symbol, n=source.count[source.index(symbol)])
    cut.save(str(files.path(out / "dict.txt")))
    with open(files.path(out / IMPORT_INFO), "w", encoding="utf-8") as f:
        json.dump({**import_info, INFO_KEY: info}, f, indent=2)
        f.write("\n")
    return info


def reindex_data(data_dir: Path, cut: Dictionary, new_index: np.ndarray, files: AtomicFiles, out: Path, info: dict):
    """OUT/NAME: the splits of ``data_dir`` with every id replaced by ``new_index[id]``; everything else copied."""
    rewritten = {"dict.txt", CONFIG}
    for split in splits_of(data_dir):
        for part in PARTS:
            ids, sizes = split_ids(data_dir, split, part)
            builder = indexed_dataset.make_builder(
                str(files.path(out / f"{split}.{part}.bin")), impl="mmap", vocab_size=len(cut)
            )
            for item in np.split(new_index[ids], np.cumsum(sizes)[:-1]):  # one array per example
                builder.add_item(torch.from_numpy(item))
            builder.finalize(str(files.path(out / f"{split}.{part}.idx")))
            rewritten |= {f"{split}.{part}.bin", f"{split}.{part}.idx"}
    for path in sorted(data_dir.iterdir()):
        if path.is_file() and path.name not in rewritten:
            shutil.copyfile(path, files.path(out / path.name))
    cut.save(str(files.path(out / "dict.txt")))
    config = load_config(str(data_dir))
    config[INFO_KEY] = {**info, "source_data": str(data_dir.resolve())}
    config["hf_dir"] = str((out.parent / "encoder").resolve())  # the cut encoder: --roberta-path, not a tokenizer
    with open(files.path(out / CONFIG), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def check_same_symbols(source: Path, cut_dir: Path, rows: np.ndarray) -> int:
    """Read the written splits back: every example holds the same symbols as before. Returns the tokens checked."""
    checked = 0
    for split in splits_of(source):
        for part in PARTS:
            old, old_sizes = split_ids(source, split, part)
            new, new_sizes = split_ids(cut_dir, split, part)
            if not (np.array_equal(old_sizes, new_sizes) and np.array_equal(rows[new], old)):
                shutil.rmtree(cut_dir)
                raise RuntimeError(f"{cut_dir}/{split}.{part}: the re-indexed tokens differ from {source}; removed")
            checked += old.size
    return checked


def main(args: argparse.Namespace) -> dict:
    log_like_fairseq()
    data = dict(args.data)
    if len(data) != len(args.data):
        raise ValueError("--data: each NAME may be given once")
    for flag, path in [("--encoder", args.encoder / "model.pt"), ("--encoder", args.encoder / IMPORT_INFO)] + [
        ("--data", d / "dict.txt") for d in data.values()
    ]:
        if not path.is_file():
            raise ValueError(f"{flag}: {path} not found")
    dictionary = Dictionary.load(str(next(iter(data.values())) / "dict.txt"))
    for data_dir in data.values():
        if Dictionary.load(str(data_dir / "dict.txt")).symbols != dictionary.symbols:
            raise ValueError(f"--data {data_dir}: its dict.txt differs from the first --data's; cut them separately")
    rows = kept_rows(data, dictionary)
    cut = cut_dictionary(dictionary, rows)
    new_index = np.full(len(dictionary), -1, dtype=np.int64)
    new_index[rows] = np.arange(len(rows))
    with atomic_group() as files:
        info = cut_encoder(args.encoder, cut.symbols, args.half, files, args.out / "encoder")
        for name, data_dir in data.items():
            reindex_data(data_dir, cut, new_index, files, args.out / name, info)
    checked = sum(check_same_symbols(d, args.out / name, rows) for name, d in data.items())
    size = os.path.getsize(args.out / "encoder" / "model.pt")
    print(
        f"| cut: {len(rows)} of {len(dictionary)} dictionary rows kept ({info['rows']} of {info['source_rows']} "
        f"encoder rows, {info['dtype']}, model.pt {size / 2**20:.1f} MiB) -> {args.out}; {checked} tokens read back "
        "with the same symbols"
    )
    return {**info, "dictionary_rows": len(rows), "tokens_checked": checked, "model_bytes": size}


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cut_vocab", description=__doc__.split("\n")[0])
    parser.add_argument("--encoder", type=Path, required=True, help="imported encoder directory (--roberta-path)")
    parser.add_argument("--data", type=data_arg, action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--out", type=Path, required=True, help="output directory (encoder/ and one folder per NAME)")
    parser.add_argument("--half", action="store_true", help="store the encoder's weights as float16")
    return parser


def cli_main() -> None:
    run_cli(main, get_parser())


if __name__ == "__main__":
    cli_main()
