"""Table b of examples/qa/README.md from the runs' prediction files: EM / F1 per kind and seed, each kind against
the sliding window on the same questions, and where the Cluster-Former layers' question tokens look.

    python -m benchmarks.qa_report.table --results benchmarks/results/qa_pretrained/device \
        --squad examples/data/squad/dev-v1.1.json --held-out-from 40 --markdown report.md --json report.json

--results holds one folder per scored run, CONTEXTS_KIND_seedSEED/ with summary.json (settings, device) and
valid.pred.json (official SQuAD predictions), and where measured reach.json (fairseq-clusterformer-qa-reach) and
gate_ablation.json (benchmarks/qa_gate_ablation.py: a hybrid checkpoint scored with its gates closed) and
centroid_shift.json (benchmarks/centroid_shift.py: how far one more K-Means refresh would move the centroids). The
gold answers are those of --squad's articles from --held-out-from on; a question without a prediction scores 0, as
in the official script, and each run's recomputed EM / F1 must equal its summary's (else the gold is not the one
it was scored on). Per kind: EM / F1 of each seed, their mean and half their spread. Against --baseline (none): the
per-question difference (same question, same seed; averaged over the seeds both kinds have) and its 95 % percentile
bootstrap interval over questions (--resamples draws with --seed), and each seed's own mean difference. The intervals
take questions as independent; the questions of one article are not, so they are narrower than an interval over
articles would be; and they hold the seeds fixed, so they say nothing of what another seed would do.
--results takes several folders where the seeds of one budget lie in several series' (KIND=DIR: only DIR's runs of
KIND, where DIR holds other runs of the same kind and seed).
--baseline-from reads the baseline's runs from another results folder: a series whose runs differ from the earlier
ones (another code version of the long-range layers) shares the baseline runs they were paired with.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.qa_report.paired_bootstrap import bootstrap_interval, paired_differences
from benchmarks.qa_report.run_folders import row_kind, scored_runs
from benchmarks.qa_report.table_mechanism import fmt, gate_rows, mechanism_markdown, reach_rows, shift_rows
from fairseq_clusterformer.layers.kinds import KINDS, NO_LONG_RANGE
from fairseq_clusterformer.qa.ops.metrics import exact_match, max_over_gold, token_f1
from fairseq_clusterformer.scripts.cli_logging import run_cli

# a run's variant in words (benchmarks/qa_device/runs.py names the variants): sliding windows only, then every kind of
# layers/kinds.py at layers 5, 6, its hybrid there, and one layer of it at 6 or at 5; the tables' order
LABELS = {NO_LONG_RANGE: f"sliding windows only (`{NO_LONG_RANGE}`)"}
LABELS |= {name: f"{kind.title} layers 5, 6 (`{name}`)" for name, kind in KINDS.items()}
LABELS |= {f"{name}-hybrid": f"hybrid {kind.title} layers 5, 6 (`{name}-hybrid`)" for name, kind in KINDS.items()}
LABELS |= {
    f"{name}-layer{layer}": f"one {kind.title} layer, {layer} (`{name}-layer{layer}`)"
    for name, kind in KINDS.items()
    for layer in (6, 5)
}
METRICS = {"exact_match": exact_match, "f1": token_f1}


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.qa_report.table", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--results",
        nargs="+",
        required=True,
        help="results folders holding one folder per scored run; KIND=DIR takes only DIR's runs of KIND",
    )
    parser.add_argument("--squad", type=Path, required=True, help="SQuAD v1.1 JSON holding the held-out articles")
    parser.add_argument("--held-out-from", type=int, required=True, help="index of the first held-out article")
    parser.add_argument("--baseline", default="none", help="the kind the others are compared with")
    parser.add_argument(
        "--baseline-from",
        type=Path,
        help="read the --baseline kind's runs from this results folder (a series that shares them with another)",
    )
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1, help="the bootstrap's random seed")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--json", type=Path, help="write every figure here")
    return parser


def held_out_gold(squad: Path, first: int) -> dict[str, list[str]]:
    articles = json.loads(squad.read_text(encoding="utf-8"))["data"][first:]
    gold = {q["id"]: [a["text"] for a in q["answers"]] for a in articles for p in a["paragraphs"] for q in p["qas"]}
    if not gold:
        raise ValueError(f"--squad {squad}: no question in its articles from --held-out-from {first} on")
    return gold


def per_question(predictions: dict[str, str], gold: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """Metric -> Q scores in percent, in ``gold``'s order; a missing prediction scores 0."""
    return {name: 100.0 * np.array([max_over_gold(metric, predictions[q], answers) if q in predictions else 0.0
                                    for q, answers in gold.items()])
            for name, metric in METRICS.items()}  # fmt: skip


def load_results(entries: list[str], gold: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The runs of every --results entry (DIR, or KIND=DIR: run_folders.py), each scored per question against
    ``gold``; two runs of one contexts, kind and seed are refused, naming both folders."""
    placed = scored_runs(entries, run_place, "contexts, kind, seed")
    return [scored_run(folder, summary, gold) for folder, summary in placed.values()]


def run_place(folder: Path, summary: dict[str, Any]) -> tuple[str, str, int]:
    """A run's row of table b: its contexts (the folder name's first word), kind and seed."""
    return folder.name.split("_")[0], row_kind(summary), summary["settings"]["seed"]


def scored_run(folder: Path, summary: dict[str, Any], gold: dict[str, list[str]]) -> dict[str, Any]:
    """One run's per-question scores, checked against its summary, and the mechanism measurements beside it."""
    predictions = json.loads((folder / "valid.pred.json").read_text(encoding="utf-8"))
    scores = per_question(predictions, gold)
    for name, values in scores.items():
        if abs(values.mean() - summary[name]) > 1e-6:
            raise ValueError(
                f"{folder / 'summary.json'}: {name} {summary[name]:.4f}, but {values.mean():.4f} against --squad's "
                "articles from --held-out-from: not the questions it was scored on"
            )

    def measured(name: str) -> Any:
        path = folder / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    contexts, kind, seed = run_place(folder, summary)
    return {"name": folder.name, "contexts": contexts, "kind": kind, "seed": seed, "summary": summary,
            "scores": scores, "predictions": predictions,
            "reach": measured("reach.json"), "gate_ablation": measured("gate_ablation.json"),
            "centroid_shift": measured("centroid_shift.json")}  # fmt: skip


def kind_order(kind: str) -> tuple[int, str]:
    """Table order: LABELS' first, any other after them."""
    return (list(LABELS).index(kind) if kind in LABELS else len(LABELS), kind)


def kind_rows(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Kind -> seeds, per-seed EM / F1, mean and half the spread."""
    rows: dict[str, dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: (kind_order(r["kind"]), r["seed"])):
        row = rows.setdefault(run["kind"], {"seeds": [], **{m: [] for m in METRICS}})
        row["seeds"].append(run["seed"])
        for m in METRICS:
            row[m].append(float(run["scores"][m].mean()))
    for row in rows.values():
        for m in METRICS:
            row[f"{m}_mean"] = float(np.mean(row[m]))
            row[f"{m}_half_spread"] = float((max(row[m]) - min(row[m])) / 2)
    return rows


def paired(runs: list[dict[str, Any]], baseline: str, resamples: int, seed: int) -> dict[str, dict[str, Any]]:
    """Kind -> the seeds it shares with the baseline, and per metric the mean per-question difference and interval."""
    by = {(r["kind"], r["seed"]): r for r in runs}
    out = {}
    for kind in sorted({r["kind"] for r in runs} - {baseline}, key=kind_order):
        seeds = sorted(s for k, s in by if k == kind and (baseline, s) in by)
        if not seeds:
            continue
        entry: dict[str, Any] = {"seeds": seeds, "questions": int(by[(kind, seeds[0])]["scores"]["f1"].size)}
        for m in METRICS:
            diff = paired_differences(np.stack([by[(kind, s)]["scores"][m] for s in seeds]),
                                      np.stack([by[(baseline, s)]["scores"][m] for s in seeds]))  # fmt: skip
            # each seed's own difference beside the mean: the interval covers which questions were asked, not
            # what another seed would do, and at small budgets seeds move EM by more than that interval's width
            per_seed = [float((by[(kind, s)]["scores"][m] - by[(baseline, s)]["scores"][m]).mean()) for s in seeds]
            entry[m] = {"mean": float(diff.mean()), "interval": bootstrap_interval(diff, resamples, seed),
                        "per_seed": per_seed}  # fmt: skip
        out[kind] = entry
    return out


def seed_cell(row: dict[str, Any], metric: str) -> str:
    """``57.46 / 56.95 (57.21 ± 0.25)``: each seed's score, then their mean ± half the spread (table a's form)."""
    cell = " / ".join(fmt(v) for v in row[metric])
    if len(row[metric]) > 1:
        cell += f" ({fmt(row[f'{metric}_mean'])} ± {fmt(row[f'{metric}_half_spread'])})"
    return cell


def markdown(report: dict[str, Any]) -> str:
    devices = ", ".join(report["devices"]) or "no run yet"
    lines = [f"Held-out articles from {report['held_out_from']} on, {report['questions']} questions, last checkpoints;"
             f" device: {devices}.", ""]  # fmt: skip
    if report["baseline_from"]:
        lines[-1:] = [f"The `{report['baseline']}` runs are those of `{report['baseline_from']}`.", ""]
    for contexts, title in (("article", "b. whole articles"), ("paragraph", "a. paragraph contexts")):
        rows = report["kinds"].get(contexts, {})
        if not rows:
            continue
        lines += ["| run | EM | F1 |", "| --- | --- | --- |"]
        for kind, row in rows.items():
            cells = [seed_cell(row, m) for m in METRICS]
            seeds = " / ".join(map(str, row["seeds"]))
            lines.append(f"| {title}, {LABELS.get(kind, kind)}, seed{'s' * (len(row['seeds']) > 1)} {seeds} | "
                         f"{cells[0]} | {cells[1]} |")  # fmt: skip
        lines.append("")
    if report["paired"]:
        lines += [f"Against `{report['baseline']}`, same question and seed (mean over the shared seeds); 95 % bootstrap"
                  f" interval over the questions ({report['resamples']} resamples, seed {report['seed']}), which holds"
                  " the seeds fixed; each seed's own difference beside it:", "",
                  "| kind | seeds | EM difference [95 % interval] | EM by seed | F1 difference [95 % interval] | "
                  "F1 by seed |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for kind, entry in report["paired"].items():
            cells = [f"{e['mean']:+.2f} [{e['interval'][0]:+.2f}, {e['interval'][1]:+.2f}] | "
                     + " / ".join(f"{d:+.2f}" for d in e["per_seed"]) for e in (entry[m] for m in METRICS)]  # fmt: skip
            lines.append(f"| `{kind}` | {' / '.join(map(str, entry['seeds']))} | {cells[0]} | {cells[1]} |")
        lines.append("")
    if report["out_of_memory"]:
        lines += ["fairseq logged running out of memory (it then skips the batch, so the run saw other data) in: "
                  + ", ".join(f"{name} ({n} lines)" for name, n in report["out_of_memory"].items()), ""]  # fmt: skip
    lines += mechanism_markdown(report)
    return "\n".join(lines).rstrip() + "\n"


def main(args: argparse.Namespace) -> dict[str, Any]:
    gold = held_out_gold(args.squad, args.held_out_from)
    runs = load_results(args.results, gold)
    if args.baseline_from:
        if any(r["kind"] == args.baseline for r in runs):
            given = " ".join(args.results)
            raise ValueError(f"--results {given} has {args.baseline} runs of its own: drop --baseline-from")
        # a baseline drawn from the same random numbers as the series' runs, shared rather than copied or re-run
        runs += load_results([f"{args.baseline}={args.baseline_from}"], gold)
    runs.sort(key=lambda r: (kind_order(r["kind"]), r["seed"]))  # the mechanism tables keep this order
    report = {
        "baseline_from": str(args.baseline_from) if args.baseline_from else None,
        "held_out_from": args.held_out_from,
        "questions": len(gold),
        "baseline": args.baseline,
        "resamples": args.resamples,
        "seed": args.seed,
        "devices": sorted({r["summary"].get("device", "?") for r in runs}),
        "kinds": {c: kind_rows([r for r in runs if r["contexts"] == c]) for c in sorted({r["contexts"] for r in runs})},
        "paired": paired([r for r in runs if r["contexts"] == "article"], args.baseline, args.resamples, args.seed),
        "reach": reach_rows(runs),
        "gate_ablation": gate_rows(runs),
        "centroid_shift": shift_rows(runs),
        "out_of_memory": {r["name"]: r["summary"]["oom_lines"] for r in runs if r["summary"].get("oom_lines")},
    }
    text = markdown(report)
    print(text, end="")
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def cli_main() -> None:
    run_cli(main, get_parser())


if __name__ == "__main__":
    cli_main()
