"""The budget series' report: EM of each variant against the updates it trained (one line a seed), and for every run
with a cluster ablation its three passes beside `none`'s score on the same questions.

    python -m benchmarks.qa_budget_report --results none=benchmarks/results/qa_pretrained/cpu_reduced \
        benchmarks/results/qa_pretrained/cpu_paired benchmarks/results/qa_pretrained/cpu_budget \
        --variants none,cluster-layer6 --squad examples/data/squad/dev-v1.1.json --held-out-from 40 \
        --figure benchmarks/results/qa_pretrained/cpu_budget/budget.png \
        --markdown benchmarks/results/qa_pretrained/cpu_budget/budget.md

Each --results entry is a folder, or VARIANT=FOLDER to take only that variant's runs from it (cpu_reduced/ holds the
400-update `none` runs the paired series used, beside superseded runs of other variants). A folder holds one folder
per scored run (benchmarks/qa_cpu_collect.py's layout: summary.json with the
run's settings, valid.pred.json, and cluster_ablation.json where benchmarks/qa_cluster_ablation.py measured it). A
run is placed by its settings (variant, seed, updates); two runs with the same three are an error, naming both. The
ablation rows give EM / F1 of the trained, shuffled and identity passes, their paired differences from the trained
pass (from the ablation's own JSON), and `none`'s score on the same questions (its run of the same seed and budget),
so the reading rule of cpu_budget/README.md can be applied as written: how much of the trained pass's lead over
`none` each ablation keeps.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.qa_report.run_folders import row_kind, scored_runs
from benchmarks.qa_report.table import held_out_gold, per_question
from fairseq_clusterformer.scripts.cli_logging import run_cli


def load_runs(entries: list[str], variants: list[str]) -> dict[tuple[str, int, int], dict]:
    """(variant, seed, updates) -> {summary, folder} for every scored run of ``variants`` (run_folders.py)."""

    def place(folder: Path, summary: dict) -> tuple[str, int, int] | None:
        settings = summary["settings"]
        variant = row_kind(summary)
        return (variant, int(settings["seed"]), int(settings["updates"])) if variant in variants else None

    placed = scored_runs(entries, place, "variant, seed, updates")
    return {key: {"summary": summary, "folder": folder} for key, (folder, summary) in placed.items()}


def curve_rows(runs: dict[tuple[str, int, int], dict]) -> list[dict]:
    return [{"variant": v, "seed": s, "updates": u, **{m: r["summary"][m] for m in ("exact_match", "f1")}}
            for (v, s, u), r in sorted(runs.items())]  # fmt: skip


def ablation_rows(runs: dict[tuple[str, int, int], dict], gold: dict[str, list[str]]) -> list[dict]:
    """One row per run with a cluster_ablation.json: each pass's EM / F1 and difference, and `none`'s score on the
    ablation's questions (None where that run of `none` is missing)."""
    rows = []
    for (variant, seed, updates), run in sorted(runs.items()):
        path = run["folder"] / "cluster_ablation.json"
        if not path.is_file():
            continue
        ablation = json.loads(path.read_text(encoding="utf-8"))
        questions = list(ablation["answers"]["trained"])
        row = {"variant": variant, "seed": seed, "updates": updates, "questions": len(questions)}
        for metric in ("exact_match", "f1"):
            row[metric] = ablation[metric]
        baseline = runs.get(("none", seed, updates))
        if baseline is not None:
            predictions = json.loads((baseline["folder"] / "valid.pred.json").read_text(encoding="utf-8"))
            scores = per_question(predictions, {q: gold[q] for q in questions})
            row["none"] = {metric: float(values.mean()) for metric, values in scores.items()}
        rows.append(row)
    return rows


def kept_share(row: dict, label: str, metric: str = "exact_match") -> float | None:
    """The share of the trained pass's lead over `none` that pass ``label`` keeps (1: all of it, 0: none of it)."""
    if "none" not in row:
        return None
    lead = row[metric]["trained"]["mean"] - row["none"][metric]
    return None if lead == 0 else (row[metric][label]["mean"] - row["none"][metric]) / lead


def markdown(curve: list[dict], ablations: list[dict]) -> str:
    lines = ["| variant | seed | updates | EM | F1 |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{r['variant']}` | {r['seed']} | {r['updates']:,} | {r['exact_match']:.2f} | {r['f1']:.2f} |"
              for r in curve]  # fmt: skip
    if ablations:
        lines += ["", "| run | questions | EM trained / shuffled / identity | EM shuffled - trained | EM identity - "
                  "trained | `none` EM there | lead kept: shuffled / identity |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in ablations:
            em = r["exact_match"]
            diffs = [f"{em[p]['difference']:+.2f} [{em[p]['interval'][0]:+.2f}, {em[p]['interval'][1]:+.2f}]"
                     for p in ("shuffled", "identity")]  # fmt: skip
            none = f"{r['none']['exact_match']:.2f}" if "none" in r else "not run"
            kept = [kept_share(r, p) for p in ("shuffled", "identity")]
            kept_cell = " / ".join("-" if k is None else f"{k:.2f}" for k in kept)
            lines.append(f"| `{r['variant']}` seed {r['seed']}, {r['updates']:,} updates | {r['questions']} | "
                         f"{em['trained']['mean']:.2f} / {em['shuffled']['mean']:.2f} / {em['identity']['mean']:.2f} | "
                         f"{diffs[0]} | {diffs[1]} | {none} | {kept_cell} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def figure(curve: list[dict], path: Path) -> None:
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # it logs its start-up at DEBUG under a root logger
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    variants = sorted({r["variant"] for r in curve})
    for n, variant in enumerate(variants):
        for seed in sorted({r["seed"] for r in curve if r["variant"] == variant}):
            points = sorted((r["updates"], r["exact_match"]) for r in curve
                            if (r["variant"], r["seed"]) == (variant, seed))  # fmt: skip
            ax.plot(*zip(*points), marker="o", color=f"C{n}", linestyle="-" if seed == 1 else "--",
                    label=f"{variant}, seed {seed}")  # fmt: skip
    ax.set_xlabel("updates (8 questions each)")
    ax.set_ylabel("EM on 1,589 held-out questions")
    ax.set_title("EM against the training budget (whole SQuAD articles, MiniLM)", fontsize=10)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.qa_budget_report", description=__doc__.split("\n")[0])
    parser.add_argument("--results", nargs="+", required=True, help="results folders of scored runs (or VARIANT=DIR)")
    parser.add_argument("--variants", default="none,cluster-layer6", help="the variants drawn, comma-separated")
    parser.add_argument("--squad", type=Path, required=True, help="SQuAD v1.1 JSON holding the held-out articles")
    parser.add_argument("--held-out-from", type=int, required=True, help="index of the first held-out article")
    parser.add_argument("--figure", type=Path, help="write the curve here (PNG)")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--json", type=Path, help="write the rows here")
    return parser


def main(args: argparse.Namespace) -> dict:
    runs = load_runs(args.results, args.variants.split(","))
    if not runs:
        raise ValueError(f"--results: no scored run of {args.variants} in {', '.join(map(str, args.results))}")
    curve, ablations = curve_rows(runs), ablation_rows(runs, held_out_gold(args.squad, args.held_out_from))
    text = markdown(curve, ablations)
    print(text, end="")
    if args.markdown is not None:
        args.markdown.write_text(text, encoding="utf-8")
    if args.figure is not None:
        figure(curve, args.figure)
    report = {"curve": curve, "ablation": ablations}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    run_cli(main, get_parser())
