"""The data of the Table 3 comparison: the committed default texts, their splits and fairseq-preprocess.

Word level trains on one text and splits another at an article boundary into valid and test; character level reads a
text as bytes and splits it as enwik8 is split. Both binarise with the fairseq-preprocess beside this Python.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import fairseq_clusterformer
from fairseq_clusterformer.scripts.console_scripts import console_script
from fairseq_clusterformer.scripts.lm.prepare_enwik8 import split_bytes, write_splits

# the --user-dir of every run: the package this process imports, so that fairseq imports the same one
PACKAGE = Path(fairseq_clusterformer.__file__).resolve().parent
REPO = Path(__file__).resolve().parents[2]
# the committed data of the clone (see missing_file)
EXAMPLE_DATA = REPO / "examples" / "data"
DEFAULT_DATA = {
    "--word-train": EXAMPLE_DATA / "wikitext-2" / "valid.txt",
    "--word-eval": EXAMPLE_DATA / "wikitext-2" / "test.txt",
    "--char-text": EXAMPLE_DATA / "tinyshakespeare" / "input.txt",
}


def missing_file(flag: str, path: Path) -> FileNotFoundError:
    """The error for a text file that is not there, saying which flag to pass when it was the default."""
    if path == DEFAULT_DATA.get(flag):
        return FileNotFoundError(
            f"{flag}: the default {path} is not here (it is committed in a clone of the repository, under "
            f"examples/data/): pass {flag} FILE"
        )
    return FileNotFoundError(f"{flag} {path}: no such file")


def split_at_article(lines: list[str]) -> int:
    """Index of the line that starts the WikiText article nearest to the middle of ``lines`` (by words).

    An article opens with a blank line and a `` = Title = `` line; the cut goes before the blank line, so both halves
    hold whole articles. Text without article titles is cut at the middle line.
    """
    words = [len(line.split()) + 1 for line in lines]
    half, seen, best = sum(words) / 2, 0, None
    for index, line in enumerate(lines):
        title = re.fullmatch(r" = [^=].* = \n?", line)
        if title and index > 0:
            cut = index - 1 if not lines[index - 1].strip() else index
            if cut > 0 and (best is None or abs(seen - half) < abs(best[1] - half)):
                best = (cut, sum(words[:cut]))
        seen += words[index]
    return best[0] if best else max(1, len(lines) // 2)


def binarise(text_dir: Path, dest: Path) -> Path:
    """fairseq-preprocess train/valid/test.txt of ``text_dir`` into ``dest`` (skipped when already there)."""
    if (dest / "dict.txt").exists():
        return dest
    command = [console_script("fairseq-preprocess"), "--only-source", "--destdir", str(dest), "--workers", "1"]
    for split in ("train", "valid", "test"):
        command += [f"--{split}pref", str(text_dir / f"{split}.txt")]
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        raise RuntimeError(f"fairseq-preprocess failed on {text_dir}:\n{proc.stdout[-3000:]}")
    return dest


def prepare_word(train: Path, evaluation: Path, level_dir: Path) -> Path:
    """Train on ``train``; split ``evaluation`` at an article boundary into valid (first half) and test (second)."""
    for flag, path in (("--word-train", train), ("--word-eval", evaluation)):
        if not path.is_file():
            raise missing_file(flag, path)
    text = level_dir / "text"
    text.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(train, text / "train.txt")
    lines = evaluation.read_text(encoding="utf-8").splitlines(keepends=True)
    cut = split_at_article(lines)
    (text / "valid.txt").write_text("".join(lines[:cut]), encoding="utf-8")
    (text / "test.txt").write_text("".join(lines[cut:]), encoding="utf-8")
    return binarise(text, level_dir / "data-bin")


def prepare_char(source: Path, level_dir: Path) -> Path:
    """Read ``source`` as bytes and split it as enwik8 is split: 90 % / 5 % / 5 %, one token per byte."""
    if not source.is_file():
        raise missing_file("--char-text", source)
    data = source.read_bytes()
    held_out = max(1, len(data) // 20)
    write_splits(split_bytes(data, held_out, held_out), level_dir / "text")
    return binarise(level_dir / "text", level_dir / "data-bin")
