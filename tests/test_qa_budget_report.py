"""benchmarks/qa_budget_report.py on results folders made here: runs placed by (variant, seed, updates), VARIANT=DIR
taking one variant from a folder, two runs of one place refused naming both, the ablation rows with `none`'s score
on the ablation's own questions and the share of the lead each ablation keeps, and the curve drawn."""

from __future__ import annotations

import importlib
import json
from argparse import Namespace
from pathlib import Path

import pytest

from benchmarks.qa_report.table import held_out_gold
from tests.conftest import REPO

SQUAD = REPO / "examples" / "data" / "squad" / "dev-v1.1.json"


def report_module():
    return importlib.import_module("benchmarks.qa_budget_report")


def scored_run(results: Path, variant: str, seed: int, updates: int, right: int, questions: list, gold: dict) -> Path:
    """A collected run answering its first ``right`` questions with a gold answer and the others wrongly."""
    folder = results / f"article_{variant}_seed{seed}"
    folder.mkdir(parents=True)
    predictions = {q: (gold[q][0] if i < right else "no such answer") for i, q in enumerate(questions)}
    em = 100.0 * right / len(questions)
    settings = {"kind": variant.split("-")[0], "variant": variant, "seed": seed, "updates": updates}
    (folder / "summary.json").write_text(json.dumps({"settings": settings, "exact_match": em, "f1": em}))
    (folder / "valid.pred.json").write_text(json.dumps(predictions))
    return folder


def ablation(folder: Path, questions: list, means: dict) -> None:
    """A cluster_ablation.json of the passes' EM means (the answers' contents do not enter the report)."""
    report = {"answers": {p: dict.fromkeys(questions, "x") for p in means}}
    for metric in ("exact_match", "f1"):
        report[metric] = {p: {"mean": m} for p, m in means.items()}
        for p in ("shuffled", "identity"):
            report[metric][p].update(difference=means[p] - means["trained"], interval=[-9.0, 9.0])
    (folder / "cluster_ablation.json").write_text(json.dumps(report))


def test_curve_ablation_rows_and_figure(tmp_path):
    gold = held_out_gold(SQUAD, 40)
    questions = list(gold)[:20]
    old, new = tmp_path / "old", tmp_path / "new"
    scored_run(old, "none", 1, 400, 4, questions, gold)
    scored_run(old, "cluster-layer6", 1, 400, 9, questions, gold)  # superseded: taken from old for none only
    scored_run(tmp_path / "paired", "cluster-layer6", 1, 400, 6, questions, gold)
    scored_run(new, "none", 1, 1400, 8, questions, gold)
    ablated = scored_run(new, "cluster-layer6", 1, 1400, 12, questions, gold)
    ablation(ablated, questions[:10], {"trained": 70.0, "shuffled": 50.0, "identity": 70.0})
    module = report_module()
    args = Namespace(results=[f"none={old}", str(tmp_path / "paired"), str(new)], variants="none,cluster-layer6",
                     squad=SQUAD, held_out_from=40, figure=tmp_path / "curve.png", markdown=tmp_path / "b.md",
                     json=None)  # fmt: skip
    report = module.main(args)
    assert [(r["variant"], r["updates"], r["exact_match"]) for r in report["curve"]] == [
        ("cluster-layer6", 400, 30.0), ("cluster-layer6", 1400, 60.0), ("none", 400, 20.0), ("none", 1400, 40.0)]
    (row,) = report["ablation"]
    # none answered its first 8 questions right: all 10 of the ablation's questions but 2 -> 80.0 there
    assert row["questions"] == 10 and row["none"]["exact_match"] == pytest.approx(80.0)
    # trained 70 against none's 80 there: a lead of -10; shuffled 50 keeps (50 - 80) / -10 = 3 times it
    assert module.kept_share(row, "shuffled") == pytest.approx(3.0)
    assert module.kept_share(row, "identity") == pytest.approx(1.0)
    text = (tmp_path / "b.md").read_text()
    assert "| `cluster-layer6` seed 1, 1,400 updates | 10 | 70.00 / 50.00 / 70.00 | -20.00 [-9.00, +9.00] |" in text
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_runs_of_one_place_are_refused_naming_both(tmp_path):
    gold = held_out_gold(SQUAD, 40)
    questions = list(gold)[:5]
    a = scored_run(tmp_path / "a", "none", 1, 400, 1, questions, gold)
    b = scored_run(tmp_path / "b", "none", 1, 400, 2, questions, gold)
    args = Namespace(results=[str(tmp_path / "a"), str(tmp_path / "b")], variants="none", squad=SQUAD,
                     held_out_from=40, figure=None, markdown=None, json=None)  # fmt: skip
    with pytest.raises(ValueError, match=f"{b} and {a} are both"):
        report_module().main(args)
    args.results = [str(tmp_path / "nowhere")]
    with pytest.raises(ValueError, match="is not a folder"):
        report_module().main(args)
