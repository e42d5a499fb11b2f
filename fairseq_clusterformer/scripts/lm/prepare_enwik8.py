"""Split a byte stream (enwik8, or any file read as bytes) into train / valid / test text for fairseq-preprocess.

The standard enwik8 split (the one Transformer-XL and the Cluster-Former paper use): the first 90M bytes train, the
next 5M valid, the last 5M test, one token per byte. Each byte is written as its decimal value followed by a space;
the newline byte ends the line instead, and fairseq-preprocess turns every line end into one end-of-sentence token,
so every byte is still exactly one token and fairseq-eval-lm's "Loss (base 2)" is bits per character.

    python -m fairseq_clusterformer.scripts.lm.prepare_enwik8 --input enwik8.zip --out-dir enwik8-text
    python -m fairseq_clusterformer.scripts.lm.prepare_enwik8 --input input.txt --out-dir chars \
        --valid-bytes 55000 --test-bytes 55000
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

STANDARD_HELD_OUT = 5_000_000  # bytes in each of valid and test
NEWLINE = ord("\n")
# byte value -> its text token; the newline byte closes the line (fairseq reads the line end as one token)
BYTE_TOKENS = [b"\n" if value == NEWLINE else f"{value} ".encode() for value in range(256)]
CHUNK = 1 << 20


def read_bytes(path: Path) -> bytes:
    """The raw bytes of ``path``; a .zip must hold exactly one file (enwik8.zip holds ``enwik8``)."""
    if not path.is_file():
        raise FileNotFoundError(f"--input {path}: no such file")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            members = [info for info in archive.infolist() if not info.is_dir()]
            if len(members) != 1:
                names = [info.filename for info in members]
                raise ValueError(f"--input {path}: expected a zip holding one file (enwik8), found {names}")
            return archive.read(members[0])
    return path.read_bytes()


def split_bytes(data: bytes, valid_bytes: int, test_bytes: int) -> dict[str, bytes]:
    """The last ``test_bytes`` are test, the ``valid_bytes`` before them valid, everything before that train."""
    for flag, value in (("--valid-bytes", valid_bytes), ("--test-bytes", test_bytes)):
        if value < 1:
            raise ValueError(f"{flag} must be positive, got {value}")
    train_bytes = len(data) - valid_bytes - test_bytes
    if train_bytes < 1:
        raise ValueError(
            f"--valid-bytes ({valid_bytes}) + --test-bytes ({test_bytes}) leave no training bytes in an input of "
            f"{len(data)} bytes"
        )
    return {
        "train": data[:train_bytes],
        "valid": data[train_bytes : train_bytes + valid_bytes],
        "test": data[train_bytes + valid_bytes :],
    }


def bytes_to_text(data: bytes) -> bytes:
    """One text token per byte: decimal values separated by spaces, the newline byte as a line break."""
    chunks = (data[start : start + CHUNK] for start in range(0, len(data), CHUNK))
    return b"".join(b"".join(BYTE_TOKENS[value] for value in chunk) for chunk in chunks)


def write_splits(parts: dict[str, bytes], out_dir: Path) -> dict[str, int]:
    """Write ``<split>.txt`` (tokens) and ``<split>.raw`` (the bytes) per split; returns the bytes per split."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, part in parts.items():
        (out_dir / f"{name}.txt").write_bytes(bytes_to_text(part))
        (out_dir / f"{name}.raw").write_bytes(part)
    return {name: len(part) for name, part in parts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, required=True, help="enwik8, enwik8.zip, or any file read as bytes")
    parser.add_argument("--out-dir", type=Path, required=True, help="where train/valid/test.txt are written")
    parser.add_argument("--valid-bytes", type=int, default=STANDARD_HELD_OUT, help="validation bytes (5M standard)")
    parser.add_argument("--test-bytes", type=int, default=STANDARD_HELD_OUT, help="test bytes (5M standard)")
    args = parser.parse_args(argv)
    try:
        data = read_bytes(args.input)
        sizes = write_splits(split_bytes(data, args.valid_bytes, args.test_bytes), args.out_dir)
    except (OSError, ValueError) as error:
        print(f"prepare_enwik8: {error}", file=sys.stderr)
        return 2
    print(" ".join(f"{name}={count:,}" for name, count in sizes.items()) + f" bytes -> {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
