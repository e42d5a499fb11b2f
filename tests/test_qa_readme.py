"""examples/qa/README.md says what a reader gets: a row's figures carry the precision they were scored in, and the
figures the recipe's own scoring gives, as the lab note measured them."""

import re

from tests.conftest import REPO

README = REPO / "examples" / "qa" / "README.md"
LAB_NOTE = REPO / "benchmarks" / "results" / "qa_pretrained" / "README.md"


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
