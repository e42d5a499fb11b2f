"""Forward+backward time and peak memory of ONE layer against sequence length.

B = batch (1), T = tokens, C = channels, H = heads, F = FFN dim.

Every (layer kind, T) case runs in a fresh interpreter (``--worker``), so its peak resident set is its own:
the worker resets the peak (``/proc/self/clear_refs``) after building the layer, then creates the input,
runs warm-up and timed forward+backward passes, and reports the peak minus the resident set at the reset.
Workers run with ``MALLOC_MMAP_THRESHOLD_`` fixed, so freed tensor memory goes back to the OS at once and the
resident set follows the live tensors. Before running a case the parent estimates its memory (extrapolating the
same kind's largest measured T: linearly for windowed layers, quadratically for full attention) and skips it when
the estimate is above ``--budget-gib``.

    OMP_NUM_THREADS=2 nice .venv/bin/python -m benchmarks.layer_scaling --out-dir benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from benchmarks.common import (
    GIB,
    add_shape_args,
    append_jsonl,
    peak_rss,
    read_jsonl,
    reset_peak_rss,
    run_worker,
    stopwatch,
    timed_repeats,
)
from benchmarks.layer_builder import available_kinds, build
from benchmarks.machine import LoadSampler, machine_info

HERE = Path(__file__).resolve()
DEFAULT_LENGTHS = "1024,2048,3072,4096,8192,12288,16384,32768"
QUADRATIC = {"full"}


def worker(args) -> dict:
    """One case in this process: build, reset the peak, run, report."""
    torch.manual_seed(args.seed)
    layer = build(args.kind, args).train()
    baseline = reset_peak_rss()
    t = args.length
    if args.kind == "full":
        x = torch.randn(t, 1, args.dim, requires_grad=True)  # T x B x C, fairseq's layout
        # fairseq's decoder caches this T x T future mask (buffered_future_mask): part of full attention's memory
        mask = torch.triu(torch.full((t, t), float("-inf")), 1)

        def forward():
            return layer(x, self_attn_mask=mask, self_attn_padding_mask=None)[0]
    else:
        x = torch.randn(1, t, args.dim, requires_grad=True)  # B x T x C

        def forward():
            return layer(x, None)

    grad = torch.randn_like(x)

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        forward().backward(grad)

    wall, cpu = timed_repeats(step, args.warmup, args.repeats)
    return {
        "kind": args.kind,
        "length": t,
        "threads": torch.get_num_threads(),
        "wall_times_s": wall,
        "cpu_times_s": cpu,
        "median_wall_s": statistics.median(wall),
        "median_s": statistics.median(cpu) if args.clock == "cpu" else statistics.median(wall),
        "clock": args.clock,
        "peak_bytes": peak_rss() - baseline,
    }


def analytic_bytes(kind: str, t: int, args) -> float:
    """Rough first estimate before anything of this kind was measured (generous on purpose)."""
    per_token = 4 * 3 * (30 * args.dim + 4 * args.ffn + 4 * args.heads * args.window)  # ~3 window copies
    quadratic = 4 * (1 + 4 * args.heads) * t * t if kind in QUADRATIC else 0  # mask + scores/softmax/grads
    return per_token * t + quadratic


def estimate(kind: str, t: int, done: list[dict], args) -> tuple[float, float | None]:
    """(bytes, seconds per pass) expected for a case, from the largest measured T of the same kind."""
    power = 2 if kind.partition(":")[0] in QUADRATIC else 1
    measured = [r for r in done if r["kind"] == kind and "peak_bytes" in r and r["length"] < t]
    if not measured:
        return analytic_bytes(kind, t, args), None
    last = max(measured, key=lambda r: r["length"])
    scale = (t / last["length"]) ** power
    return 1.1 * last["peak_bytes"] * scale, last["median_s"] * scale


class MemoryGate:
    """Lets concurrent cases start only while the sum of their estimated peaks stays within the budget."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.in_use = 0.0
        self.cond = threading.Condition()

    def acquire(self, need: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.in_use == 0 or self.in_use + need <= self.budget)
            self.in_use += need

    def release(self, need: float) -> None:
        with self.cond:
            self.in_use -= need
            self.cond.notify_all()


def run_all(args) -> None:
    """One chain of cases per kind (its lengths in increasing order, each estimated from the previous one);
    ``--jobs`` chains run at once, each worker on one thread."""
    results = args.out_dir / "layer_scaling.jsonl"
    done = read_jsonl(results) if args.resume else []
    if not args.resume and results.exists():
        results.unlink()
    kinds = args.kinds.split(",") if args.kinds else available_kinds()
    # on a shared 2-core CPU the whole grid takes hours: the side kinds stop at a shorter T
    max_length = {k: int(v) for k, _, v in (item.partition("=") for item in args.max_length.split(",") if item)}
    # fixed mmap threshold: freed tensors go back to the OS at once, so the workers' resident set tracks live memory
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    names = ("dim", "heads", "ffn", "window", "stride", "clusters", "groups", "dropout", "attention_dropout", "seed")
    names += ("warmup",)
    common = [item for name in names for item in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]
    common += ["--clock", args.clock]
    gate, lock = MemoryGate(args.budget_gib * GIB), threading.Lock()
    lengths = sorted(int(v) for v in args.lengths.split(","))

    def chain(kind: str) -> None:
        for t in lengths:
            if t > max_length.get(kind, t):
                continue
            with lock:
                if any(r["kind"] == kind and r["length"] == t and "median_s" in r for r in done):
                    continue
                need, seconds = estimate(kind, t, done, args)
            repeats = args.repeats if t < args.long_from else args.long_repeats
            record = {"kind": kind, "length": t, "estimate_bytes": need}
            if need > args.budget_gib * GIB:
                record["skipped"] = f"does not fit in {args.budget_gib:g} GiB budget (estimated {need / GIB:.1f} GiB)"
            elif seconds is not None and seconds * (repeats + args.warmup) > args.max_case_s:
                record["skipped"] = f"estimated {seconds:.0f} s per pass, above --max-case-s {args.max_case_s:g}"
            else:
                gate.acquire(need)
                try:
                    with LoadSampler(every_s=2.0) as load:
                        with stopwatch() as took:
                            worker_args = [*common, "--kind", kind, "--length", str(t), "--repeats", str(repeats)]
                            worker_timeout = args.max_case_s * 3 + 120
                            record.update(run_worker("benchmarks.layer_scaling", worker_args, worker_timeout))
                        record["wall_s"] = took.wall
                    record.update(load.summary())
                finally:
                    gate.release(need)
            with lock:
                print(json.dumps(record), flush=True)
                append_jsonl(results, record)
                done.append(record)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for future in [pool.submit(chain, kind) for kind in kinds]:
            future.result()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kind", help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--kinds", default="", help="comma-separated kinds (default: every kind this checkout builds)")
    p.add_argument("--lengths", default=DEFAULT_LENGTHS, help="comma-separated sequence lengths T")
    add_shape_args(p)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="timed passes per case below --long-from")
    p.add_argument("--long-repeats", type=int, default=3, help="timed passes per case from --long-from on")
    p.add_argument(
        "--max-length",
        default="cluster-paper=16384,lsh-strict=8192,sparse-strict=8192,window:attention=8192,"
        "cluster-paper:attention=8192",
        help="KIND=T,...: longest T run for these kinds (others: every --lengths)",
    )
    p.add_argument("--jobs", type=int, default=1, help="cases run at once (one thread each; CPU time stays per case)")
    p.add_argument("--long-from", type=int, default=8192)
    p.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="time the tables and targets use: process CPU time (robust on a shared machine with 1 thread) or wall",
    )
    p.add_argument("--budget-gib", type=float, default=8.0, help="skip cases estimated above this much memory")
    p.add_argument("--max-case-s", type=float, default=240.0, help="skip cases estimated to take longer")
    p.add_argument("--out-dir", type=Path, default=HERE.parent / "results")
    p.add_argument(
        "--resume", action="store_true", help="keep the results file; run only cases not measured yet (re-check skips)"
    )
    p.add_argument("--render-only", action="store_true", help="only write the table and plot from the results file")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not args.render_only:
        run_all(args)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    from benchmarks.layer_scaling_report import render

    render(args.out_dir, machine_info(), args)


if __name__ == "__main__":
    sys.exit(main())
