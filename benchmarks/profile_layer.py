"""Where one layer's forward+backward time goes, against what this machine can do: why a layer misses a time target.

T = tokens, C = channels. Builds layers by ``layer_builder.py`` (``layer_scaling.py``'s flags), runs a warm-up and one
profiled forward+backward pass per kind under ``torch.profiler`` (one thread), and writes per operator: calls, self
time (the profiler's wall clock, scaled so that the pass adds up to its process CPU time), FLOPs (the profiler counts
them for matrix products) and the bytes of the operator's inputs (4 bytes an element: an estimate of the traffic,
outputs and re-reads not counted). The floor of every operator is its FLOPs at this machine's measured float32
matmul rate plus its bytes at the measured copy bandwidth; the table shows how far each is from it.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.profile_layer --kinds window,cluster-strict --length 3072
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import markdown_table, parse_shape_args, stopwatch
from benchmarks.layer_builder import build
from fairseq_clusterformer.ops.precision import matmul_gflops

HERE = Path(__file__).resolve()


def copy_gbps(numel: int = 32 * 2**20, repeats: int = 5) -> float:
    """Measured copy bandwidth (GB/s of CPU time, read + write counted), median of ``repeats``."""
    x, y = torch.randn(numel), torch.empty(numel)
    y.copy_(x)  # touch the destination once: page faults are not bandwidth
    times = []
    for _ in range(repeats):
        with stopwatch() as took:
            y.copy_(x)
        times.append(took.cpu)
    return 2 * 4 * numel / sorted(times)[len(times) // 2] / 1e9


def profile_kind(kind: str, length: int, args) -> list[dict]:
    torch.manual_seed(args.seed)
    layer = build(kind, args).train()
    if kind == "full":
        x = torch.randn(length, 1, args.dim, requires_grad=True)  # T x B x C
        mask = torch.triu(torch.full((length, length), float("-inf")), 1)

        def forward():
            return layer(x, self_attn_mask=mask, self_attn_padding_mask=None)[0]
    else:
        x = torch.randn(1, length, args.dim, requires_grad=True)  # B x T x C

        def forward():
            return layer(x, None)

    forward().sum().backward()  # warm-up
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        with stopwatch() as took:
            forward().sum().backward()
    rows = {}
    for event in prof.events():
        row = rows.setdefault(event.name, {"op": event.name, "calls": 0, "self_ms": 0.0, "flops": 0, "bytes": 0})
        row["calls"] += 1
        row["self_ms"] += event.self_cpu_time_total / 1000
        row["flops"] += event.flops or 0  # counted only for the products themselves, never for their callers
        if event.flops or not event.cpu_children:  # a caller's inputs are its callees', counted there
            row["bytes"] += 4 * sum(math.prod(shape) for shape in event.input_shapes if shape)
    # the profiler times operators by the wall clock, which on a loaded machine includes time other jobs held the
    # core: scale them by the pass's CPU / wall time, so that they add up to the CPU time the pass used
    for row in rows.values():
        row["cpu_ms"] = row["self_ms"] * took.cpu / took.wall
    return sorted((r for r in rows.values() if r["self_ms"] > 0), key=lambda r: -r["self_ms"])


def report(kind: str, length: int, rows: list[dict], gflops: float, gbps: float, top: int) -> str:
    total_ms = sum(r["cpu_ms"] for r in rows)
    flops = sum(r["flops"] for r in rows)
    traffic = sum(r["bytes"] for r in rows)
    table = []
    for r in rows[:top]:
        floor = 1000 * (r["flops"] / (gflops * 1e9) + r["bytes"] / (gbps * 1e9))
        table.append(
            [r["op"], r["calls"], f"{r['cpu_ms']:.0f}", f"{100 * r['cpu_ms'] / total_ms:.0f}%",
             f"{r['flops'] / 1e9:.2f}", f"{r['bytes'] / 2**20:.0f}", f"{floor:.0f}"]
        )  # fmt: skip
    floor_ms = 1000 * (flops / (gflops * 1e9) + traffic / (gbps * 1e9))
    return (
        f"### {kind}, T={length}\n\nProfiled forward+backward: {total_ms:.0f} ms of CPU time; {flops / 1e9:.1f} GFLOP "
        f"counted in matrix products ({flops / 1e6 / total_ms:.1f} GFLOP/s overall); about {traffic / 2**30:.2f} "
        f"GiB of operator inputs read. Floor at {gflops:.0f} GFLOP/s and {gbps:.1f} GB/s: {floor_ms:.0f} ms "
        f"(measured / floor = {total_ms / floor_ms:.2f}).\n\n"
        + markdown_table(["operator", "calls", "CPU ms", "share", "GFLOP", "input MiB", "floor ms"], table)
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default="window,cluster-strict,cluster-paper")
    p.add_argument("--length", type=int, default=3072)
    p.add_argument("--top", type=int, default=12, help="operators listed per kind")
    p.add_argument("--out", type=Path, default=HERE.parent / "results" / "profile.md")
    own, rest = p.parse_known_args(argv)
    args = parse_shape_args(rest)
    gflops, gbps = matmul_gflops(torch.float32, 2048, 10), copy_gbps()
    sections = [
        f"Measured on this machine just before profiling (one thread): float32 matmul {gflops:.0f} GFLOP/s "
        f"(2048 x 2048), copy bandwidth {gbps:.1f} GB/s. Layer: dim {args.dim}, {args.heads} heads, FFN {args.ffn}, "
        f"window {args.window} / stride {args.stride}, {args.clusters} clusters, batch 1."
    ]
    for kind in own.kinds.split(","):
        sections.append(report(kind, own.length, profile_kind(kind, own.length, args), gflops, gbps, own.top))
    text = "\n\n".join(sections)
    own.out.parent.mkdir(parents=True, exist_ok=True)
    own.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
