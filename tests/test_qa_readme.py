"""examples/qa/README.md says what a reader gets: the first QA command it shows runs its table's first row, and a
row's figures carry the precision they were scored in, with the figures the recipe's own scoring gives, as the lab
note measured them."""

import re
import shlex
import subprocess

from tests.conftest import REPO, subprocess_env

README = REPO / "examples" / "qa" / "README.md"
LAB_NOTE = REPO / "benchmarks" / "results" / "qa_pretrained" / "paragraph" / "README.md"


def row(starting: str) -> str:
    rows = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith(starting)]
    assert len(rows) == 1, f"{README}: {len(rows)} rows start with {starting!r}"
    return rows[0]


def test_the_bfloat16_row_says_it_is_scored_in_float32_and_gives_the_recipes_bfloat16_score():
    bf16 = row("| a. the same fine-tuned under bfloat16")
    assert "scored in float32" in bf16 and "the recipe scores in bfloat16" in bf16
    scoring = r"in bfloat16 \(`qa-predict --autocast-bf16`\)\s+instead of float32: EM ([\d.]+) / F1 ([\d.]+)"
    measured = re.search(scoring, LAB_NOTE.read_text(encoding="utf-8"))
    assert measured, f"{LAB_NOTE} no longer states the bfloat16 scoring of table a's checkpoint"
    assert f"seed 1 EM {measured.group(1)} / F1 {measured.group(2)}" in bf16


def test_the_first_qa_command_a_reader_meets_reproduces_the_tables_first_row(tmp_path):
    """Run as a dry run (its --out moved under tmp_path): the settings it fine-tunes with are the row's."""
    text = README.read_text(encoding="utf-8")
    first = next(line for line in text.splitlines() if "examples/qa/cpu_pretrained.sh" in line and "bash " in line)
    words = shlex.split(first)
    env = dict(word.split("=", 1) for word in words[: words.index("bash")])
    args = words[words.index("bash") + 2 :]
    args[args.index("--out") + 1] = str(tmp_path / "out")
    proc = subprocess.run(["bash", REPO / "examples" / "qa" / "cpu_pretrained.sh", *args, "--dry-run"], cwd=REPO,
                          env=subprocess_env(**env), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    train = next(line for line in proc.stdout.splitlines() if "examples/qa/train.sh" in line)
    settings = dict(re.findall(r" ([A-Z_]+)=(\S+)", train))
    first_row = row("| a. paragraph contexts, sliding windows only")
    updates, lr = re.search(r"(\d+) updates, lr ([\d.e-]+)", first_row).groups()
    assert (settings["UPDATES"], settings["LR"], settings["LONG_RANGE"]) == (updates, lr, "none"), train
    assert "--autocast-bf16" not in train and settings["ATTENTION_DROPOUT"] == "0.1"  # the row is float32's
    assert "/squad_paragraph/bin" in train and "paragraph_none_seed1" in train
    assert "UPDATES=" not in proc.stderr  # no word about a learning rate tuned for another budget
