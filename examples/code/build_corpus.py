"""Build a language-modelling corpus from Python source files: one file per line, Python's own tokens.

    python examples/code/build_corpus.py --out DIR [--packages torch fairseq-fixed] [--data FOLDER] [--stdlib]

Where the files come from:
- default: the ``.py`` files of installed third-party distributions named by ``--packages`` (default: torch and the
  fairseq package of this environment, both pinned exactly by the project's set-up, so two machines with the same
  set-up build the same corpus). Python's standard library is never a source of training text; ``--stdlib`` writes it
  as a separate evaluation split (``stdlib.txt``) with the training vocabulary.
- ``--data FOLDER``: every ``*.py`` file under FOLDER instead.

How a file becomes tokens (``tokenize`` from the standard library, so names, operators, literals and indentation are
tokens exactly as Python reads them):
- keywords and operators are kept; NEWLINE, INDENT and DEDENT become ``<nl>``, ``<indent>``, ``<dedent>``;
  comments and blank-line markers are dropped.
- a name is kept when it occurs in at least ``--min-files`` training files (``self``, ``torch``, ``shape``: the shared
  vocabulary of the language and its libraries). Any other name is file-local, and becomes a per-file placeholder
  ``<v0>``, ``<v1>``, ... numbered by first appearance in the file. Why placeholders and not sub-words: a file-local
  name can only be predicted from its own earlier occurrences, so the placeholder keeps exactly the signal a
  long-range layer should pick up (copy an identity seen hundreds of tokens back) while the vocabulary stays small
  enough for a CPU; sub-words would also let a model guess a new name from its spelling, which no attention span helps.
  Past ``--placeholders`` distinct local names in one file the rest share ``<name>``.
- numbers and short strings without whitespace are kept when frequent in the same sense, otherwise ``<num>`` /
  ``<str>``; f-strings and docstrings are always ``<str>``.

Splits: files are deduplicated by content, then the SHA-256 of their content decides the split (90 / 5 / 5 % by
default), so a file and its copies always land in the same split; ``files.tsv`` lists which file went where.
``corpus.json`` records the Python version, every
source package with its version, the settings, the skipped files and the SHA-256 of every split, so two machines can
tell whether they built the same data.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import io
import json
import keyword
import os
import platform
import sys
import sysconfig
import tokenize
from collections import Counter
from pathlib import Path

SPLITS = ("train", "valid", "test")
STRUCTURE = {tokenize.NEWLINE: "<nl>", tokenize.INDENT: "<indent>", tokenize.DEDENT: "<dedent>"}
DROPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
# Python >= 3.12 splits an f-string into several tokens, 3.11 gives one STRING token; both become <str>
FSTRING_START = getattr(tokenize, "FSTRING_START", None)
FSTRING_END = getattr(tokenize, "FSTRING_END", None)
KEYWORDS = set(keyword.kwlist) | set(keyword.softkwlist)


def default_packages() -> list[str]:
    fairseq = "fairseq-fixed" if sys.version_info >= (3, 11) else "fairseq"
    return ["torch", fairseq]


def package_files(names: list[str]) -> tuple[list[tuple[str, Path]], dict[str, str]]:
    """(package, path) of every installed ``.py`` file of the named distributions, and their versions."""
    files, versions = [], {}
    for name in names:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"build_corpus.py: --packages {name}: not installed in {sys.prefix}") from None
        versions[name] = dist.version
        paths = sorted(str(f) for f in dist.files or [] if str(f).endswith(".py"))
        files += [(name, Path(dist.locate_file(p))) for p in paths]
    return files, versions


def folder_files(folder: Path, label: str) -> list[tuple[str, Path]]:
    if not folder.is_dir():
        raise SystemExit(f"build_corpus.py: --data {folder}: not a folder")
    found = sorted(folder.rglob("*.py"))
    files = [(label, p) for p in found if p.is_file()]
    # named, not dropped without a word: what the corpus would otherwise silently lack
    for path in found:
        if not path.is_file():
            why = "a folder, not a file" if path.is_dir() else "a broken symbolic link" if path.is_symlink() else None
            where = f"--data {folder}" if label == "data" else f"the {label} folder"
            print(f"build_corpus.py: {where}: skipped {path}: {why or 'not a regular file'}", file=sys.stderr)
    if not files:
        raise SystemExit(f"build_corpus.py: --data {folder}: no .py files under it")
    return files


def split_of(digest: str, valid_pct: int, test_pct: int) -> str:
    bucket = int(digest[:8], 16) % 100
    return "test" if bucket < test_pct else "valid" if bucket < test_pct + valid_pct else "train"


def is_fstring(text: str) -> bool:
    prefix = text[: min(i for i in (text.find("'"), text.find('"')) if i >= 0)]
    return "f" in prefix.lower()


def raw_tokens(source: bytes) -> list[tuple[int, str]]:
    """(type, text) of a file's tokens, f-strings as one STRING "f''". Raises on files Python cannot tokenize."""
    out, depth = [], 0
    for tok in tokenize.tokenize(io.BytesIO(source).readline):
        # Python >= 3.12: FSTRING_START ... FSTRING_END, possibly nested; everything inside is part of the string
        if FSTRING_START is not None and tok.type == FSTRING_START:
            depth += 1
            if depth == 1:
                out.append((tokenize.STRING, "f''"))
            continue
        if FSTRING_END is not None and tok.type == FSTRING_END:
            depth -= 1
            continue
        if depth or tok.type in DROPPED:
            continue
        if tok.type == tokenize.STRING and is_fstring(tok.string):
            out.append((tokenize.STRING, "f''"))
        else:
            out.append((tok.type, tok.string))
    return out


def literal_key(kind: int, text: str) -> str | None:
    """The vocabulary candidate a token stands for, or None when it is always kept (keywords, operators)."""
    if kind == tokenize.NAME:
        return None if text in KEYWORDS else text
    if kind == tokenize.NUMBER:
        return text
    if kind == tokenize.STRING:
        # a string with whitespace could not be one token in fairseq's dict.txt; long ones are docstrings or messages
        return text if text != "f''" and len(text) <= 24 and not any(c.isspace() for c in text) else "<str>"
    return None


def placeholder_for(kind: int) -> str:
    return {tokenize.NAME: "<name>", tokenize.NUMBER: "<num>"}.get(kind, "<str>")


def encode(tokens: list[tuple[int, str]], vocab: set[str], max_placeholders: int) -> list[str]:
    """A file's output tokens: kept words verbatim, file-local names as <v0>, <v1>, ... by first appearance."""
    out, local = [], {}
    for kind, text in tokens:
        if kind in STRUCTURE:
            out.append(STRUCTURE[kind])
            continue
        key = literal_key(kind, text)
        if key is None:
            if not any(c.isspace() for c in text):  # an ERRORTOKEN can be a lone space
                out.append(text)
        elif key in vocab:
            out.append(key)
        elif kind == tokenize.NAME:
            if key not in local and len(local) < max_placeholders:
                local[key] = f"<v{len(local)}>"
            out.append(local.get(key, "<name>"))
        else:
            out.append(placeholder_for(kind))
    return out


def read_sources(
    files: list[tuple[str, Path]], max_bytes: int
) -> tuple[list[tuple[str, str, str, list]], list[dict], Counter]:
    """(package, sha256, file name, raw tokens) of each distinct file with tokens, the skipped ones with a reason, and
    how many were left out as copies of another file or for holding no token (not listed: both are ordinary)."""
    seen, kept, skipped, dropped = set(), [], [], Counter()
    for package, path in files:
        try:
            data = path.read_bytes()
        except OSError as error:  # its own message may not name the file (a failed read, EIO)
            raise SystemExit(f"build_corpus.py: cannot read {path}: {error}") from None
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen:
            dropped["copying another file"] += 1
            continue
        seen.add(digest)
        if len(data) > max_bytes:
            skipped.append({"file": f"{package}:{path.name}", "sha256": digest, "reason": f"over {max_bytes} bytes"})
            continue
        try:
            tokens = raw_tokens(data)
        except (tokenize.TokenError, SyntaxError, UnicodeDecodeError) as e:
            skipped.append({"file": f"{package}:{path.name}", "sha256": digest, "reason": type(e).__name__})
            continue
        if tokens:
            kept.append((package, digest, path.name, tokens))
        else:
            dropped["without a token"] += 1
    return kept, skipped, dropped


def check_splits(by_split: dict[str, list], percents: dict[str, int], where: str, files: int, left_out: str) -> None:
    """Stop, before anything is written, when a split that should hold files has none: fairseq would binarise it as an
    empty file, and training or evaluation would fail on it much later."""
    usable = sum(map(len, by_split.values()))
    if not usable:
        raise SystemExit(f"build_corpus.py: {where}: none of its {files} .py files can be used: {left_out}")
    empty = [name for name in SPLITS if not by_split[name] and percents[name] > 0]
    if empty:
        shares = ", ".join(f"{name} {percents[name]} %" for name in SPLITS)
        raise SystemExit(
            f"build_corpus.py: {where}: the {' and '.join(empty)} split{'s' if len(empty) > 1 else ''} would be "
            f"empty: {usable} usable file{'s' if usable > 1 else ''} are too few for the split shares ({shares}; "
            "the SHA-256 of each file's content picks its split, so a share of p % needs well over 100 / p files)"
            f"{'; left out: ' + left_out if left_out else ''}. Give more files, or change --valid-percent / "
            "--test-percent"
        )


def left_out_summary(skipped: list[dict], dropped: Counter) -> str:
    """The files that gave no text, and why, for the messages of check_splits."""
    parts = [f"{n} {'file' if n == 1 else 'files'} {why}" for why, n in sorted(dropped.items())]
    if skipped:
        named = ", ".join(f"{s['file']} ({s['reason']})" for s in skipped[:5])
        more = ", ..." if len(skipped) > 5 else ""
        parts.append(f"{len(skipped)} skipped (not tokenizable as Python, or over --max-bytes): {named}{more}")
    return "; ".join(parts)


def build_vocab(train: list[list[tuple[int, str]]], min_files: int) -> set[str]:
    """Names, numbers and short strings that occur in at least ``min_files`` training files."""
    files_with = Counter()
    for tokens in train:
        files_with.update({key for kind, text in tokens if (key := literal_key(kind, text)) is not None})
    return {key for key, n in files_with.items() if n >= min_files and key != "<str>"}


def write_split(path: Path, lines: list[list[str]]) -> dict:
    text = "".join(" ".join(tokens) + "\n" for tokens in lines)
    path.write_text(text, encoding="utf-8")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return {"files": len(lines), "tokens": sum(map(len, lines)), "sha256": digest}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="build_corpus.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for train.txt, valid.txt, test.txt and corpus.json")
    parser.add_argument("--packages", nargs="+", default=None, help="installed distributions (default: torch, fairseq)")
    parser.add_argument("--data", help="a folder of .py files to use instead of installed packages")
    parser.add_argument("--stdlib", action="store_true", help="also write Python's standard library as stdlib.txt")
    parser.add_argument("--min-files", type=int, default=20, help="a word is in the vocabulary from this many files")
    parser.add_argument("--placeholders", type=int, default=1000, help="distinct <vN> placeholders per file")
    parser.add_argument("--valid-percent", type=int, default=5)
    parser.add_argument("--test-percent", type=int, default=5)
    parser.add_argument("--max-bytes", type=int, default=512_000, help="skip larger files (generated code)")
    args = parser.parse_args(argv)
    if args.data and args.packages:
        parser.error("--data and --packages exclude each other")
    if not 0 <= args.valid_percent + args.test_percent < 100 or min(args.valid_percent, args.test_percent) < 0:
        parser.error("--valid-percent and --test-percent must be >= 0 and leave some training files")
    if args.min_files < 1 or args.placeholders < 1:
        parser.error("--min-files and --placeholders must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.data:
        files, versions = folder_files(Path(args.data), "data"), {}
    else:
        files, versions = package_files(args.packages or default_packages())
    sources, skipped, dropped = read_sources(files, args.max_bytes)
    by_split, listing = {name: [] for name in SPLITS}, []
    for package, digest, name, tokens in sources:
        split = split_of(digest, args.valid_percent, args.test_percent)
        by_split[split].append(tokens)
        listing.append(f"{split}\t{digest}\t{package}\t{name}\n")
    percents = {"train": 100 - args.valid_percent - args.test_percent, "valid": args.valid_percent}
    percents["test"] = args.test_percent
    where = f"--data {args.data}" if args.data else f"--packages {' '.join(versions)}"
    check_splits(by_split, percents, where, len(files), left_out_summary(skipped, dropped))
    vocab = build_vocab(by_split["train"], args.min_files)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    splits = {
        name: write_split(out / f"{name}.txt", [encode(t, vocab, args.placeholders) for t in by_split[name]])
        for name in SPLITS
    }
    if args.stdlib:
        stdlib = folder_files(Path(sysconfig.get_paths()["stdlib"]), "stdlib")
        stdlib = [(p, f) for p, f in stdlib if "site-packages" not in f.parts and "test" not in f.parts]
        std_sources, std_skipped, _ = read_sources(stdlib, args.max_bytes)
        splits["stdlib"] = write_split(
            out / "stdlib.txt", [encode(t, vocab, args.placeholders) for _, _, _, t in std_sources]
        )
        skipped += std_skipped
    manifest = {
        "python": platform.python_version(),
        "source": {"data": os.path.abspath(args.data)} if args.data else {"packages": versions},
        "settings": {
            k: getattr(args, k) for k in ("min_files", "placeholders", "valid_percent", "test_percent", "max_bytes")
        },
        "vocabulary": len(vocab),
        "splits": splits,
        "skipped": skipped,
    }
    # which file went where, in the order of the split files' lines: lets anyone check that the splits are disjoint
    (out / "files.tsv").write_text("split\tsha256\tpackage\tfile\n" + "".join(listing), encoding="utf-8")
    (out / "corpus.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    for name, split in splits.items():
        print(f"{name}: {split['files']} files, {split['tokens']:,} tokens, sha256 {split['sha256'][:16]}")
    print(
        f"vocabulary: {len(vocab):,} kept words (in >= {args.min_files} training files); skipped files: {len(skipped)}"
    )


if __name__ == "__main__":
    main()
