"""Forward+backward time and peak memory of ``--long-range-values next``'s attention: the written-out reference
(N x H x Lq x Lk float32 scores and weights) against the fused op (one ``scaled_dot_product_attention`` call).

N = windows (B*K), H = heads, C = channels, Lq / Lk = queries / keys per window, T = tokens.

The shapes are those of ``WindowedTransformerLayer.run_band`` with one head set (window l, stride m): N = T / m
query blocks of Lq = m queries, each over Lk = l - 1 + m keys, query i's own key at slot l - 1 + i, under the band
mask of the unsorted sequence (every token in one group). Each (op, T, dropout) case runs in a fresh interpreter
(``--worker``): it builds the inputs and the mask, runs the warm-up passes, resets the peak, then runs the timed
passes; the peak is the op's own memory (its activations, the gradients of q, k, next_v and own_v), not the
inputs'. On CPU it is the peak resident set (``common.reset_peak_rss``) with ``MALLOC_MMAP_THRESHOLD_``
fixed, on CUDA ``torch.cuda.max_memory_allocated``.

    OMP_NUM_THREADS=1 nice .venv/bin/python -m benchmarks.next_values
    .venv/bin/python -m benchmarks.next_values --device cuda --out-name next_values_cuda
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.common import (
    MIB,
    append_jsonl,
    markdown_table,
    peak_rss,
    reset_peak_rss,
    run_worker,
    stopwatch,
    timed_repeats,
)
from benchmarks.machine import LoadSampler, machine_info, machine_markdown

HERE = Path(__file__).resolve()
OPS = ("reference", "fused")
CPU_DROPOUT_NOTE = (
    "On CPU, `scaled_dot_product_attention` with dropout runs its math path (the CPU flash kernel takes no "
    "dropout: `torch._fused_sdp_choice` answers MATH), which writes the N x H x Lq x (Lk+1) weights out, so the "
    "fused op gains time and memory in the dropout-free rows only (evaluation, `--attention-dropout 0`); CUDA's "
    "memory-efficient kernel takes dropout."
)


def band_inputs(args, device: torch.device):
    """q, own_v: N x m x C, k, next_v: N x (l-1+m) x C (leaves needing gradients), the N x m x (l-1+m) mask."""
    from fairseq_clusterformer.ops.window_scheme import WindowScheme

    t, dtype = args.length, getattr(torch, args.dtype)
    scheme = WindowScheme(args.window, args.stride, t, band=True)
    positions = torch.arange(t, device=device).expand(1, t)  # B x T, B = 1
    valid = torch.ones(1, t, dtype=torch.bool, device=device)  # B x T
    allowed = scheme.mask(positions, valid, True, torch.zeros_like(positions)).flatten(0, 1)  # N x Lq x Lk
    n, lq, lk = allowed.shape
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def leaf(length):
        return torch.randn(n, length, args.dim, generator=gen, device=device, dtype=dtype).requires_grad_()

    return leaf(lq), leaf(lk), leaf(lk), leaf(lq), allowed


def worker(args) -> dict:
    """One case in this process: inputs, reset the peak, run, report."""
    from fairseq_clusterformer.ops import attention

    device = torch.device(args.device)
    op = attention.next_value_attention if args.op == "fused" else attention.reference_next_value_attention
    q, k, next_v, own_v, allowed = band_inputs(args, device)
    grad = torch.randn_like(q)
    slot = args.window - 1  # query i of a block is key slot l - 1 + i (``band_key_windows``)
    cuda = device.type == "cuda"

    def step():
        for t in (q, k, next_v, own_v):
            t.grad = None
        op(q, k, next_v, own_v, allowed, args.heads, slot, args.dropout).backward(grad)
        if cuda:
            torch.cuda.synchronize()

    for _ in range(args.warmup):  # before the reset: the first pass also maps code and allocator pools
        step()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = reset_peak_rss()
    wall, cpu = timed_repeats(step, 0, args.repeats)
    peak = torch.cuda.max_memory_allocated() if cuda else peak_rss()
    return {
        "op": args.op,
        "length": args.length,
        "dropout": args.dropout,
        "windows": q.size(0),
        "queries": q.size(1),
        "keys": k.size(1),
        "wall_times_s": wall,
        "cpu_times_s": cpu,
        "median_wall_s": statistics.median(wall),
        "median_cpu_s": statistics.median(cpu),
        "peak_bytes": peak - baseline,
    }


def render(records: list[dict], info: dict, load: dict, args) -> str:
    clock = "wall" if args.device == "cuda" else "cpu"
    rows = []
    for t in sorted({r["length"] for r in records}):
        for p in sorted({r["dropout"] for r in records}):
            case = {r["op"]: r for r in records if r["length"] == t and r["dropout"] == p and "peak_bytes" in r}
            if set(case) != set(OPS):
                continue
            ref, fused = case["reference"], case["fused"]
            speed = ref[f"median_{clock}_s"] / fused[f"median_{clock}_s"]
            shape = f"{fused['windows']} x {args.heads} x {fused['queries']} x {fused['keys']}"
            rows.append(
                [
                    f"{t:,}",
                    p,
                    shape,
                    f"{ref[f'median_{clock}_s']:.3f} ({ref['median_wall_s']:.3f})",
                    f"{fused[f'median_{clock}_s']:.3f} ({fused['median_wall_s']:.3f})",
                    f"{speed:.2f}x",
                    f"{ref['peak_bytes'] / MIB:,.0f}",
                    f"{fused['peak_bytes'] / MIB:,.0f}",
                    f"{ref['peak_bytes'] / max(fused['peak_bytes'], 1):.1f}x",
                ]
            )
    headers = ["T", "dropout", "N x H x Lq x Lk", f"reference {clock} s (wall)", f"fused {clock} s (wall)"]
    headers += ["speed-up", "reference peak MiB", "fused peak MiB", "memory ratio"]
    errors = [f"- {r['op']} T={r['length']} dropout={r['dropout']}: {r['error']}" for r in records if "error" in r]
    device = torch.cuda.get_device_name() if args.device == "cuda" else info["cpu"]
    return "\n\n".join(
        [
            "# `--long-range-values next`: written-out reference vs fused attention",
            f"`{' '.join([os.path.relpath(HERE, HERE.parent.parent), *sys.argv[1:]])}` on {args.device} ({device}). "
            f"One forward+backward of `ops.attention.next_value_attention` (fused) and "
            f"`reference_next_value_attention` at the shapes of a band layer: window {args.window}, stride "
            f"{args.stride}, C = {args.dim}, {args.heads} heads, one head set, {args.dtype}; median of "
            f"{args.repeats} passes after {args.warmup} warm-up, a fresh interpreter per case. Peak memory is the "
            "op's own (activations and input gradients, not the inputs). Times are "
            + ("process CPU seconds on one thread, wall beside them." if clock == "cpu" else "wall seconds."),
            machine_markdown(info, load),
            markdown_table(headers, rows),
            *([CPU_DROPOUT_NOTE] if args.device == "cpu" else []),
            *(["Failed cases:\n" + "\n".join(errors)] if errors else []),
        ]
    )


def run_all(args) -> None:
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)  # freed tensors go back to the OS at once
    results = args.out_dir / f"{args.out_name}.jsonl"
    if results.exists():
        results.unlink()
    names = ("device", "dtype", "dim", "heads", "window", "stride", "warmup", "repeats", "seed")
    common = [item for name in names for item in (f"--{name}", str(getattr(args, name)))]
    records = []
    with LoadSampler(every_s=2.0) as load:
        for t in (int(v) for v in args.lengths.split(",")):
            for p in (float(v) for v in args.dropouts.split(",")):
                for op in OPS:
                    with stopwatch() as took:
                        case = ["--op", op, "--length", str(t), "--dropout", str(p)]
                        record = {"op": op, "length": t, "dropout": p, "device": args.device}
                        record.update(run_worker("benchmarks.next_values", [*common, *case], args.max_case_s))
                    record["wall_s"] = took.wall
                    record["load_1min"] = os.getloadavg()[0]
                    print(json.dumps(record), flush=True)
                    append_jsonl(results, record)
                    records.append(record)
    info = machine_info()
    text = render(records, info, load.summary(), args)
    (args.out_dir / f"{args.out_name}.md").write_text(text + "\n")
    print(text)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--op", choices=OPS, help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dropout", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--lengths", default="3072,12288", help="comma-separated sequence lengths T")
    p.add_argument("--dropouts", default="0,0.1", help="comma-separated attention dropout rates")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--dim", type=int, default=512, help="channels C of the head set")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--window", type=int, default=256, help="window size l")
    p.add_argument("--stride", type=int, default=128, help="window stride m")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-case-s", type=float, default=300.0, help="a case's time limit (fresh interpreter)")
    p.add_argument("--out-dir", type=Path, default=HERE.parent / "results")
    p.add_argument("--out-name", default="next_values", help="results file names (.md, .jsonl)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    run_all(args)


if __name__ == "__main__":
    sys.exit(main())
