"""The tables of the K-Means benchmark (kmeans.md), from its results files: kmeans_refresh.jsonl (part refresh),
kmeans_stall.jsonl (part stall) and kmeans_matmul_rate.json (the float32 matmul rate, measured once).

N = banked states, C = model dim, P = clusters. Every figure written here is read from a results file that
``kmeans.py`` wrote, except the matmul rate, measured the first time a table is rendered and kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.common import markdown_table, read_jsonl
from benchmarks.machine import machine_info
from fairseq_clusterformer.ops.precision import matmul_gflops


def machine(info: dict) -> str:
    """One machine as the tables name it."""
    return f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}"


def measured_on() -> dict:
    """What each results record keeps of the machine it was measured on, so that a table re-rendered elsewhere still
    names the machine of its figures, not the one rendering them."""
    info = machine_info()
    return {key: info[key] for key in ("cpu", "cores", "torch")}


def matmul_rate(path: Path) -> dict:
    """The float32 matmul rate (GFLOP/s, one thread) and the machine it was measured on, measured once and kept, so
    re-rendering the table gives the same floors; delete the file to measure again."""
    if path.exists():
        return json.loads(path.read_text())
    rate = {"gflops": matmul_gflops(torch.float32, 2048, 10), "threads": torch.get_num_threads(), **measured_on()}
    path.write_text(json.dumps(rate) + "\n")
    return rate


def machines_line(records: list[dict], rate: dict | None) -> str:
    """The machines the figures come from: those recorded with the rows; rows of before that field take the machine
    of the matmul rate, which was measured when the first table was written from them."""
    fallback = machine(rate) if rate and "cpu" in rate else "not recorded with these results"
    names = sorted({machine(r["machine"]) if "machine" in r else fallback for r in records})
    return "Machine: " + "; ".join(names) + "." if names else "Machine: no results yet."


def flops(record: dict) -> float:
    """FLOPs of the assignment products of one refresh: every iteration multiplies N x C states by C x P centroids."""
    return 2 * record["bank"] * record["dim"] * record["clusters"] * record["iters"]


def render(args) -> str:
    refresh = read_jsonl(args.out_dir / "kmeans_refresh.jsonl")
    stall = read_jsonl(args.out_dir / "kmeans_stall.jsonl")
    rate = matmul_rate(args.out_dir / "kmeans_matmul_rate.json") if refresh else None
    sections = [machines_line(refresh + stall, rate)]
    if refresh:
        rows = [
            [
                r["device"],
                f"{r['bank']:,} x {r['dim']}",
                r["clusters"],
                r["backend"],
                r["threads"],
                f"{r['median_s']:.2f}",
                " / ".join(f"{t:.1f}" for t in r["times_s"]),
                f"{r['median_cpu_s']:.2f}",
                f"{r['load_median']:.1f} ({r['load_min']:.1f}-{r['load_max']:.1f})",
            ]
            for r in refresh
        ]
        sections.append(
            markdown_table(
                [
                    "device",
                    "bank",
                    "clusters",
                    "backend",
                    "threads",
                    "wall s (median)",
                    "each run, wall s",
                    "CPU s (median, all threads)",
                    "load avg",
                ],
                rows,
            )
        )
    if refresh:
        floors = []
        for r in (r for r in refresh if r["backend"] == refresh[0]["backend"]):
            key = (r["device"], r["dim"], r["clusters"])
            same = [q for q in refresh if (q["device"], q["dim"], q["clusters"]) == key]
            floor = flops(r) / (rate["gflops"] * 1e9)
            measured = ", ".join(
                f"{q['backend']} {q['median_cpu_s']:.1f} s ({q['median_cpu_s'] / floor:.1f}x)" for q in same
            )
            floors.append(
                f"- {r['bank']:,} x {r['dim']}, {r['clusters']} clusters: {flops(r) / 1e9:.0f} GFLOP, floor "
                f"{floor:.1f} s; measured CPU time {measured}"
            )
        on = f" ({machine(rate)})" if "cpu" in rate else ""
        sections.append(
            f"Assignment matmuls alone (2 N C P x iterations) against the float32 matmul rate{on}, measured "
            f"on one thread when the table was first written (kept in kmeans_matmul_rate.json): "
            f"{rate['gflops']:.0f} GFLOP/s of CPU time.\n\n" + "\n".join(floors)
        )
    if stall:
        rows = [
            [
                r["swap_delay"],
                r["bank_states"],
                f"{r['median_step_s']:.2f}",
                f"{r['stall_max_step_s']:.2f}",
                f"{r['stall_total_s']:.2f}",
                f"{r['refresher_stall_s']:.2f}",
                ", ".join(f"{u}: {s}" for u, s in r["refresh_steps"]),
            ]
            for r in stall
            if "swap_delay" in r
        ]
        sections.append(
            markdown_table(
                [
                    "--kmeans-swap-delay",
                    "bank states",
                    "normal step s",
                    "worst step excess s",
                    "total excess s (snapshot..install)",
                    "refresher's stall s",
                    "step times from snapshot to install",
                ],
                rows,
            )
        )
        sections += ["Refresher log:\n" + "\n".join(f"    {line}" for line in r.get("log", [])) for r in stall]
        sections += [f"Stall run error: {r['error']}" for r in stall if "error" in r]
    text = "\n\n".join(sections)
    (args.out_dir / "kmeans.md").write_text(text + "\n")
    print(text)
    return text
