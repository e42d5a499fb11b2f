"""Tables, targets and the plot of the layer-scaling benchmark, from its results file (layer_scaling.jsonl).

T = tokens. Every figure written here is read from the results file that ``layer_scaling.py`` wrote.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.common import MIB, markdown_table, read_jsonl

TIME_TARGETS = {"cluster-paper": 1.2, "cluster-strict": 1.35}  # x the window layer's time
TARGET_LENGTHS = (3072, 12288)
GROWTH = (3072, 16384, 5.5)  # 16k may cost at most 5.5x what 3k costs
STRICT_VS_PAPER = 1.3  # the strictly causal layer may cost at most 1.3x the paper's
KIND_ORDER = ["full", "window", "window:attention", "cluster-strict", "cluster-paper", "cluster-paper:attention"]


def latest(records: list[dict]) -> dict[tuple[str, int], dict]:
    """The last record of every (kind, T) case."""
    return {(r["kind"], r["length"]): r for r in records}


def cell_time(r: dict | None) -> str:
    if r is None:
        return ""
    if "median_s" in r:
        return f"{r['median_s'] * 1000:.0f}"
    return "skip" if "skipped" in r else "error"


def cell_wall(r: dict | None) -> str:
    if r is None:
        return ""
    if "median_wall_s" in r:
        return f"{r['median_wall_s'] * 1000:.0f}"
    return "skip" if "skipped" in r else "error"


def cell_memory(r: dict | None) -> str:
    if r is None:
        return ""
    if "peak_bytes" in r:
        return f"{r['peak_bytes'] / MIB:.0f}"
    return "skip" if "skipped" in r else "error"


def ratio(a: dict | None, b: dict | None, key: str) -> float | None:
    if a is None or b is None or key not in a or key not in b or not b[key]:
        return None
    return a[key] / b[key]


def guess(cases: dict, mine: dict) -> str:
    """Full attention's time at ``mine``'s T extrapolated quadratically from its longest measured T (labelled so)."""
    measured = [r for (k, _), r in cases.items() if k == "full" and "median_s" in r]
    if not measured:
        return ""
    last = max(measured, key=lambda r: r["length"])
    full = last["median_s"] * (mine["length"] / last["length"]) ** 2
    return (
        f"Not measured: full attention's T={last['length']} time extrapolated quadratically would be {full:.1f} s, "
        f"{full / mine['median_s']:.1f}x {mine['kind']}'s measured {mine['median_s']:.1f} s."
    )


def targets(cases: dict, kinds: list[str]) -> list[str]:
    lines = []
    for kind, limit in TIME_TARGETS.items():
        for t in TARGET_LENGTHS:
            r = ratio(cases.get((kind, t)), cases.get(("window", t)), "median_s")
            wall = ratio(cases.get((kind, t)), cases.get(("window", t)), "median_wall_s")
            if r is not None:
                verdict = "met" if r <= limit else "NOT met"
                lines.append(
                    f"- {kind} / window time at T={t}: {r:.2f}x (target <= {limit}x): {verdict} "
                    f"(wall-clock: {wall:.2f}x)"
                )
    low, high, limit = GROWTH
    for kind in kinds:
        for key, what in (("median_s", "time"), ("peak_bytes", "peak memory")):
            r = ratio(cases.get((kind, high)), cases.get((kind, low)), key)
            if r is None:
                continue
            if kind == "full":
                lines.append(f"- full attention {what} T={high} / T={low}: {r:.1f}x (quadratic would be 28.4x)")
            else:
                verdict = "met" if r <= limit else "NOT met"
                lines.append(f"- {kind} {what} T={high} / T={low}: {r:.2f}x (target <= {limit}x): {verdict}")
    full_runs = sorted((r for (k, _), r in cases.items() if k == "full" and "median_s" in r), key=lambda r: r["length"])
    if len(full_runs) > 1 and "median_s" not in cases.get(("full", high), {}):
        a, b = full_runs[0], full_runs[-1]
        n = b["length"] / a["length"]
        for key, what in (("median_s", "time"), ("peak_bytes", "peak memory")):
            lines.append(
                f"- full attention {what} T={b['length']} / T={a['length']}: {b[key] / a[key]:.1f}x "
                f"(linear would be {n:.0f}x, quadratic {n * n:.0f}x)"
            )
    for t in sorted({t for k, t in cases if k == "cluster-strict"}):
        r = ratio(cases.get(("cluster-strict", t)), cases.get(("cluster-paper", t)), "median_s")
        if r is not None:
            verdict = "met" if r <= STRICT_VS_PAPER else "NOT met"
            lines.append(
                f"- cluster-strict / cluster-paper time at T={t}: {r:.2f}x (target <= {STRICT_VS_PAPER}x): {verdict}"
            )
    for kind in ("cluster-strict", "cluster-paper"):
        full, mine = cases.get(("full", 16384)), cases.get((kind, 16384))
        r = ratio(full, mine, "median_s")
        if r is not None:
            lines.append(f"- full / {kind} time at T=16384: {r:.1f}x (target >= 3x): {'met' if r >= 3 else 'NOT met'}")
        elif full is not None and "skipped" in full and mine is not None and "median_s" in mine:
            lines.append(
                f"- at T=16384 full attention was not run ({full['skipped']}); {kind} ran. {guess(cases, mine)}"
            )
        full, mine = cases.get(("full", 32768)), cases.get((kind, 32768))
        if mine is None or "median_s" not in mine:
            continue
        r = ratio(full, mine, "median_s")
        if r is not None:
            lines.append(f"- full / {kind} time at T=32768: {r:.1f}x (target > 6x): {'met' if r > 6 else 'NOT met'}")
        elif full is not None and "skipped" in full:
            lines.append(
                f"- T=32768: {kind} trains ({mine['median_s']:.1f} s per pass, {mine['peak_bytes'] / MIB:.0f} MiB); "
                f"full attention {full['skipped']}: met. {guess(cases, mine)}"
            )
    for kind in kinds:
        base, _, merge = kind.partition(":")
        if merge:
            speedups = []
            for t in sorted(t for k, t in cases if k == kind):
                r = ratio(cases.get((base, t)), cases.get((kind, t)), "median_s")
                m = ratio(cases.get((base, t)), cases.get((kind, t)), "peak_bytes")
                if r is not None:
                    speedups.append(f"T={t}: {r:.2f}x faster, {m:.2f}x less memory")
            if speedups:
                lines.append(f"- --window-merge attention vs layer, {base}: " + "; ".join(speedups))
    return lines


def plot(cases: dict, kinds: list[str], lengths: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.8))
    for kind in kinds:
        done = [cases[(kind, t)] for t in lengths if "median_s" in cases.get((kind, t), {})]
        if not done:
            continue
        xs = [r["length"] for r in done]
        ax_time.loglog(xs, [r["median_s"] for r in done], marker="o", label=kind)
        ax_mem.loglog(xs, [r["peak_bytes"] / MIB for r in done], marker="o", label=kind)
    for ax, label in ((ax_time, "forward+backward time (s, median)"), (ax_mem, "peak memory (MiB)")):
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_ylabel(label)
        ax.set_xticks(lengths, [f"{t // 1024}k" if t % 1024 == 0 else str(t) for t in lengths], minor=False)
        ax.minorticks_off()
        ax.grid(True, which="major", alpha=0.3)
    ax_time.legend(fontsize=8)
    fig.suptitle("One layer, dim 512, 8 heads, FFN 2048, batch 1 (process CPU time, one thread)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(out_dir: Path, info: dict, args) -> str:
    records = read_jsonl(out_dir / "layer_scaling.jsonl")
    if not records:
        raise SystemExit(f"no results in {out_dir / 'layer_scaling.jsonl'}: run the benchmark first")
    cases = latest(records)
    present = list(dict.fromkeys(r["kind"] for r in records))
    order = [*KIND_ORDER, *sorted(k for k in present if k not in KIND_ORDER)]
    kinds = [k for k in order if k in present]
    lengths = sorted({r["length"] for r in records})
    ran = [r for r in cases.values() if "load_median" in r]
    threads = ", ".join(str(t) for t in sorted({r["threads"] for r in ran if "threads" in r}))
    load = (
        f"1-minute load average while the cases ran: min {min(r['load_min'] for r in ran):.2f}, "
        f"median {statistics.median(r['load_median'] for r in ran):.2f}, max {max(r['load_max'] for r in ran):.2f}"
        if ran
        else ""
    )
    clock = records[-1].get("clock", "wall")
    clock_name = "process CPU time, one thread" if clock == "cpu" else "wall-clock time"
    time_rows = [[t, *(cell_time(cases.get((k, t))) for k in kinds)] for t in lengths]
    wall_rows = [[t, *(cell_wall(cases.get((k, t))) for k in kinds)] for t in lengths]
    mem_rows = [[t, *(cell_memory(cases.get((k, t))) for k in kinds)] for t in lengths]
    ratio_kinds = [k for k in kinds if k != "window"]
    ratio_rows = []
    for t in lengths:
        cells = [ratio(cases.get((k, t)), cases.get(("window", t)), "median_s") for k in ratio_kinds]
        ratio_rows.append([t, *("" if c is None else f"{c:.2f}" for c in cells)])
    skipped = [f"- {k} at T={t}: {r['skipped']}" for (k, t), r in cases.items() if "skipped" in r]
    errors = [f"- {k} at T={t}: {r['error']}" for (k, t), r in cases.items() if "error" in r]
    plot(cases, kinds, lengths, out_dir / "layer_scaling.png")
    text = "\n\n".join(
        part
        for part in [
            f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB RAM, torch {info['torch']}, "
            f"torch threads per case: {threads}. {load}; the machine is shared with other jobs.",
            f"Forward+backward time per pass ({clock_name}; ms, median of the timed passes):",
            markdown_table(["T", *kinds], time_rows),
            "The same passes in wall-clock time (ms, median; includes time the scheduler gave to other jobs):",
            markdown_table(["T", *kinds], wall_rows),
            "Peak memory above the process's footprint before the input was made (MiB):",
            markdown_table(["T", *kinds], mem_rows),
            # without the window kind among the cases there is nothing to divide by: no empty table
            "Time relative to the sliding-window layer:" if "window" in kinds else "",
            markdown_table(["T", *ratio_kinds], ratio_rows) if "window" in kinds else "",
            "Targets:\n" + "\n".join(targets(cases, kinds)),
            "Skipped:\n" + "\n".join(skipped) if skipped else "",
            "Errors:\n" + "\n".join(errors) if errors else "",
            "Plot: `layer_scaling.png`.",
        ]
        if part
    )
    (out_dir / "layer_scaling.md").write_text(text + "\n")
    print(text)
    return text
