"""The repository stands on its own in a fresh clone: no tracked file points at notes or folders outside it, every
default data path is a committed file, the data READMEs' checks and commands hold, and every repository path that the
READMEs' commands name exists."""

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import common
from benchmarks.lm_compare import compare as compare_lm
from benchmarks.lm_compare import data as compare_data
from tests.conftest import REPO

DATA = REPO / "examples" / "data"

# What a user's clone cannot open. Some patterns are spelled so that their own source text does not match them
# (a character class around one letter), so that this file passes its own scan and a plain grep of the tree.
FORBIDDEN = {
    "a folder beside the clone": re.compile(r"\.\./shared\b"),
    "the development data folder": re.compile(r"\bshared[/\\]data\b"),
    "a path joined onto a folder beside the clone": re.compile(r"""/\s*["']shared["']"""),
    "the planning notes": re.compile(r"\bDESIG[N]\b"),
    "the style notes": re.compile(r"\bSTYLE\.md\b"),
    "the QA format notes": re.compile(r"\bQA_FORMAT[S]\b"),
    "an issue number": re.compile(r"\b[Ii]ssue\s*#?\d+"),
}
# roots of repository paths in commands; a token that starts elsewhere (data-bin/, checkpoints/, /tmp/) is not checked
REPO_ROOTS = ("examples/", "benchmarks/", "docs/", "tests/", "fairseq_clusterformer/")
# folders inside those roots that a command creates (git ignores them), so a path under them need not exist yet
OUTPUT_DIRS = ("benchmarks/work/",)
ROOTS_ALTERNATION = "|".join(map(re.escape, REPO_ROOTS))
PATH_TOKEN = re.compile(rf"(?<![\w./-])(?:{ROOTS_ALTERNATION})[^\s'\"`()\[\]|]*")
FENCE = re.compile(r"^ {0,3}(```|~~~)[^\n]*\n(.*?)^ {0,3}\1", re.S | re.M)
SED_SLICE = re.compile(r"^sed -n '(\d+),(\d+)p'\s+(\S+)\s*>\s*(\S+)$", re.M)
SHA_ROW = re.compile(r"^\| `([^`]+)` \|.*`([0-9a-f]{64})` \|$", re.M)


def forbidden_hits(text: str, name: str) -> list[str]:
    """``name:line: what, ...: text`` for every line of ``text`` that points outside the repository."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        found = [what for what, pattern in FORBIDDEN.items() if pattern.search(line)]
        if found:
            hits.append(f"{name}:{number}: {', '.join(found)}: {line.strip()[:100]}")
    return hits


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, stdout=subprocess.PIPE, check=True)
    return [name for name in proc.stdout.decode().split("\0") if name]


def scanned(name: str) -> bool:
    """Code and documentation: the committed data sets are not, except their READMEs (their words are Wikipedia's)."""
    return not name.startswith("examples/data/") or name.endswith(".md")


def command_paths(markdown: str) -> list[str]:
    """Repository paths named in the fenced code blocks of ``markdown``, without placeholders or line numbers."""
    paths = []
    for _, block in FENCE.findall(markdown):
        for token in PATH_TOKEN.findall(block):
            token = re.sub(r"(:\d+)+$", "", token.rstrip(".,:;")).rstrip(".,:;")
            if not any(mark in token for mark in "$<{"):  # a variable or a placeholder, not a path
                paths.append(token)
    return paths


def missing_paths(markdown: str, root: Path) -> list[str]:
    """The paths of ``command_paths`` that are neither under ``root`` (a glob matching something) nor an output."""
    return [
        path
        for path in command_paths(markdown)
        if not path.startswith(OUTPUT_DIRS)
        and not ((root / path).exists() if "*" not in path else any(root.glob(path)))
    ]


def test_no_tracked_file_points_outside_the_repository():
    hits = []
    for name in filter(scanned, tracked_files()):
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):  # a binary file (a plot), or one deleted but not yet staged
            continue
        hits += forbidden_hits(text, name)
    assert not hits, "references a clone cannot open:\n" + "\n".join(hits)


def test_the_scan_finds_each_kind_of_reference():
    # assembled from pieces so that this file itself stays clean
    quote = chr(34)
    lines = [
        "../" + "shared/" + "data/x",
        f"REPO.parent / {quote}shared{quote}",
        "DESI" + "GN.md",
        "STYLE" + ".md",
    ]
    lines += ["QA_FOR" + "MATS.md", "(iss" + "ue 5, item 1)", "Iss" + "ue #12"]
    hits = forbidden_hits("\n".join(["clean line", *lines]), "made-up.md")
    assert [int(hit.split(":")[1]) for hit in hits] == list(range(2, 2 + len(lines))), hits
    assert {what for hit in hits for what in hit.split(": ")[1].split(", ")} == set(FORBIDDEN), hits
    assert not forbidden_hits("the issues page; by design; shared caches; tests/test_qa_formats.py", "ok.md")


def test_default_data_paths_are_committed_files():
    args = compare_lm.parse_args(["--work", "unused"])
    defaults = {"--word-train": args.word_train, "--word-eval": args.word_eval, "--char-text": args.char_text}
    defaults["benchmarks.common.CHAR_SOURCE"] = common.CHAR_SOURCE
    for name, path in defaults.items():
        assert path.is_file(), f"{name}: {path} is not there"
        assert path.resolve().is_relative_to(DATA.resolve()), f"{name}: {path} is outside examples/data"
        assert path.stat().st_size > 1_000_000, f"{name}: {path} is not the full data set"


def test_a_missing_default_names_its_flag(tmp_path, monkeypatch, capsys):
    gone = tmp_path / "no-examples" / "input.txt"
    monkeypatch.setitem(compare_data.DEFAULT_DATA, "--char-text", gone)
    assert compare_lm.main(["--work", str(tmp_path / "work"), "--levels", "char"]) == 2
    err = capsys.readouterr().err
    assert f"--char-text: the default {gone} is not here" in err and "pass --char-text FILE" in err
    other = tmp_path / "typo.txt"  # a file the user named is reported as such
    assert compare_lm.main(["--work", str(tmp_path / "work"), "--levels", "char", "--char-text", str(other)]) == 2
    assert f"--char-text {other}: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("folder", ["wikitext-2-slice", "tinyshakespeare-slice"])
def test_slice_commands_rebuild_the_committed_slices(folder):
    commands = SED_SLICE.findall((DATA / folder / "README.md").read_text(encoding="utf-8"))
    assert len(commands) == 3, commands
    for first, last, source, dest in commands:
        lines = (REPO / source).read_bytes().splitlines(keepends=True)
        assert b"".join(lines[int(first) - 1 : int(last)]) == (REPO / dest).read_bytes(), dest


@pytest.mark.parametrize("folder", ["wikitext-2", "tinyshakespeare", "gpt2_bpe", "squad"])
def test_data_readmes_give_the_committed_files_sha256(folder):
    rows = SHA_ROW.findall((DATA / folder / "README.md").read_text(encoding="utf-8"))
    committed = sorted(p.name for p in (DATA / folder).iterdir() if p.name != "README.md")
    assert sorted(name for name, _ in rows) == committed
    for name, digest in rows:
        assert hashlib.sha256((DATA / folder / name).read_bytes()).hexdigest() == digest, name


READMES = ["README.md", *(str(p.relative_to(REPO)) for p in sorted(REPO.glob("examples/*/README.md")))]


@pytest.mark.parametrize("readme", READMES)
def test_paths_in_readme_commands_exist(readme):
    markdown = (REPO / readme).read_text(encoding="utf-8")
    assert not missing_paths(markdown, REPO), f"{readme}: paths that a fresh clone lacks"


def test_the_path_check_reads_commands_and_fails_on_a_missing_path():
    made_up = (
        "Run `examples/not-here.sh` (prose is not checked).\n\n"
        "```bash\n"
        "bash examples/qa/prepare_squad.sh --data examples/data/squad --out data-bin/qa/squad\n"
        "python benchmarks/missing_bench.py --out benchmarks/work/run1 --log $WORK/examples/x\n"
        "ls examples/data/*/README.md examples/<level>/train.sh /tmp/examples/gone tests/test_compare.py:12\n"
        "```\n"
        "~~~\n"
        "fairseq_clusterformer/ops/gone.py:40: warning\n"
        "~~~\n"
    )
    assert command_paths(made_up) == [
        "examples/qa/prepare_squad.sh",
        "examples/data/squad",
        "benchmarks/missing_bench.py",
        "benchmarks/work/run1",
        "examples/data/*/README.md",
        "tests/test_compare.py",
        "fairseq_clusterformer/ops/gone.py",
    ]
    assert missing_paths(made_up, REPO) == ["benchmarks/missing_bench.py", "fairseq_clusterformer/ops/gone.py"]
