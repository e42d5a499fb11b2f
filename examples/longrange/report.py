"""Tables and the plot of the long-range comparison from the breakdown's JSON files.

    python examples/longrange/report.py longrange-work/results --out benchmarks/results/longrange

Reads RESULTS/<data set>/<kind>-s<seed>.json (written by fairseq-clusterformer-longrange --json) and writes
<out>/results.md (per data set: loss per distance bucket and kind, mean of the seeds with their spread, the mechanism
statistic) and <out>/loss_by_distance.png (loss against log2 distance to the earlier occurrence, one line per kind).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

KINDS = (
    "full",
    "none",
    "cluster-strict",
    "cluster-paper",
    "lsh",
    "sparse",
    "cluster-strict-next",
    "cluster-strict-next-band",
)
BUCKETS = ("never", "within reach", "beyond reach", "beyond input")
ROLES = ("recalled", "first occurrence")  # the recall task's answers (--recall-facts)


def load(results: Path) -> dict[str, dict[str, list[dict]]]:
    """data set -> kind -> one result per seed."""
    runs: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(results.glob("*/*-s*.json")):
        kind = re.sub(r"-s\d+$", "", path.stem)
        runs[path.parent.name][kind].append(json.loads(path.read_text()))
    return runs


def cell(values: list[float]) -> str:
    """Mean of the seeds, and their spread (max - min) when there are several."""
    if all(v != v for v in values):  # NaN: a bucket without tokens
        return "-"
    mean = sum(values) / len(values)
    return f"{mean:.3f}" if len(values) == 1 else f"{mean:.3f} ± {(max(values) - min(values)) / 2:.3f}"


def mechanism_cells(runs: list[dict], task: bool) -> list[str]:
    """The mechanism columns: far tokens whose long-range layers read the earlier occurrence (the state holding it
    or the state that predicted it), those that read the state holding it (what a causal copy needs), each with the
    random-key reference; for the recall task, the recalled values that read their first occurrence."""
    mech = [r["mechanism"] for r in runs if "mechanism" in r]
    if not mech:
        return ["-"] * (3 if task else 2)

    def share(key: str, random_key: str) -> str:
        random = [sum(x[random_key] for x in m["layers"]) / len(m["layers"]) for m in mech]
        return f"{cell([m[key] for m in mech])} ({cell(random)})"

    cells = [
        share("any_layer_hit_share", "random_keys_hit_share"),
        share("any_layer_held_share", "random_keys_held_share"),
    ]
    if task:
        cells.append(cell([m.get("recalled_held_share", float("nan")) for m in mech]))
    return cells


def in_order(kinds: Iterable[str]) -> list[str]:
    """Kinds in the README's order (KINDS), then any others alphabetically: the rows of every table and the lines
    of every panel."""
    kinds = set(kinds)
    return [k for k in KINDS if k in kinds] + sorted(kinds - set(KINDS))


def table(data_set: str, kinds: dict[str, list[dict]]) -> list[str]:
    first = next(iter(kinds.values()))[0]
    task = "recall_task" in first  # scored with --recall-facts: the recalled values and their first occurrences
    extra = " recalled reads its answer | recalled | first occurrence |" if task else ""
    lines = [
        f"### {data_set}",
        "",
        f"Test loss in nats per token, mean of the seeds ± half "
        f"their spread; reach {first['reach']} tokens, inputs of {first['tokens_per_sample']} with "
        f"{first['context_window']} of context. Shares of the far ('beyond reach') tokens whose long-range layers "
        "read the earlier occurrence, in brackets what as many random keys would.",
        "",
        "| kind | all | "
        + " | ".join(BUCKETS)
        + " | far: earlier occurrence read | far: the state holding it |"
        + extra,
        "| --- | --- | " + " | ".join("---" for _ in BUCKETS) + " | --- | --- |" + " --- |" * extra.count("|"),
    ]
    for kind in in_order(kinds):
        runs = kinds[kind]
        row = [cell([r["total"]["loss_nats"] for r in runs])]
        row += [cell([r["buckets"][b]["loss_nats"] for r in runs]) for b in BUCKETS]
        row += mechanism_cells(runs, task)
        if task:
            row += [cell([r["recall_task"][name]["loss_nats"] for r in runs]) for name in ROLES]
        lines.append(f"| {kind} | " + " | ".join(row) + " |")
    tokens = {b: first["buckets"][b]["tokens"] for b in BUCKETS}
    lines += ["", "Tokens per bucket: " + ", ".join(f"{b} {n:,}" for b, n in tokens.items()) + ".", ""]
    return lines


def plot(runs: dict[str, dict[str, list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one colour per kind in every panel, so that the panels can be read against each other
    ordered = in_order(kind for kinds in runs.values() for kind in kinds)
    colours = {kind: plt.get_cmap("tab20")(i % 20) for i, kind in enumerate(ordered)}
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4.5), squeeze=False)
    for ax, (data_set, kinds) in zip(axes[0], sorted(runs.items())):
        for kind in in_order(kinds):
            by_bin = defaultdict(list)
            for r in kinds[kind]:
                for b in r["distance_bins"]:
                    by_bin[b["from"]].append(b["loss_nats"])
            xs = sorted(by_bin)
            ax.plot(xs, [sum(by_bin[x]) / len(by_bin[x]) for x in xs], marker="o", label=kind, color=colours[kind])
        ax.axvline(next(iter(kinds.values()))[0]["reach"], color="grey", linestyle=":", label="reach")
        ax.set_xscale("log", base=2)
        ax.set(title=data_set, xlabel="tokens back to the earlier occurrence", ylabel="loss (nats)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = load(args.results)
    if not runs:
        parser.error(f"{args.results}: no <data set>/<kind>-s<seed>.json files")
    args.out.mkdir(parents=True, exist_ok=True)
    lines = []
    for data_set, kinds in sorted(runs.items()):
        lines += table(data_set, kinds)
    (args.out / "results.md").write_text("\n".join(lines))
    plot(runs, args.out / "loss_by_distance.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
