"""Part 4: one layer's forward+backward time and peak memory against T, ours against the GPU's best sliding window.

Our layers are built by ``benchmarks/layer_scaling.py``'s ``build`` (the sliding window, the Cluster-Former layer in
strict and paper causality, and strict with ``--long-range-values next``); the references are
``reference_attention.BandAttentionLayer`` (SDPA with a band mask, FlexAttention, FlashAttention). Each case runs in
this process: warm-up passes, then timed passes (CUDA events on a GPU), then one pass between
``torch.cuda.reset_peak_memory_stats`` and ``max_memory_allocated`` for the peak above the layer and its input.
Dropout is 0 everywhere (FlexAttention and the band references have none). B = 1, T tokens, C channels.
"""

from __future__ import annotations

import argparse
import math

import layer_scaling
import torch

from gpu_check.common import Context, median, time_step, verdict
from gpu_check.reference_attention import IMPLEMENTATIONS, BandAttentionLayer, agreement, unavailable

NAME = "layers"
TITLE = "One layer's forward+backward: time and peak memory against T"
OURS = {"window": "window", "cluster-strict": "cluster-strict", "cluster-paper": "cluster-paper"}
OURS["cluster-strict next values"] = "cluster-strict+next"
WINDOW_KINDS = ("window", *IMPLEMENTATIONS)  # the sliding-window layers the target compares against
TARGET_RATIO, LINEAR_SLACK = 1.25, 1.25
# expected seconds per size: full is 7 kinds x 3 T x 2 precisions, 23 passes each, and FlexAttention compiles once
# per T and precision; budget keeps the shortest and the longest T in bf16 only (the target's precision), 13 passes
# each. A pass takes milliseconds on a GPU (the H100 took 3-35 ms): the time goes to starting and compiling, and 1 + 3
# passes gave one of our layers 6.3, 11.6 and 11.6 ms, too few for a median that ranks layers. Budget: 40 s on an
# H100 with 1 + 3 passes (2026-11-27); the extra passes add about a second
ESTIMATE_S = {"tiny": 30, "budget": 45, "full": 600}


def shape(ctx: Context) -> argparse.Namespace:
    if ctx.tiny:
        values = dict(dim=32, heads=4, ffn=64, window=16, stride=8, clusters=4, groups=2, lengths=[64, 128, 256])
        values.update(warmup=1, repeats=2)
    else:
        values = dict(dim=512, heads=8, ffn=2048, window=256, stride=128, clusters=512, groups=6)
        if ctx.budget:
            values.update(lengths=[3072, 32768], warmup=3, repeats=10)
        else:
            values.update(lengths=[3072, 12288, 32768], warmup=3, repeats=20)
    return argparse.Namespace(dropout=0.0, attention_dropout=0.0, long_range_values="own", **values)


def build(kind: str, args) -> torch.nn.Module:
    if kind in IMPLEMENTATIONS:
        return BandAttentionLayer(args.dim, args.heads, args.ffn, args.window, kind)
    base, _, values = OURS[kind].partition("+")
    return layer_scaling.build(base, argparse.Namespace(**{**vars(args), "long_range_values": values or "own"}))


def measure(ctx: Context, kind: str, length: int, precision: str, args) -> dict:
    """Median seconds per forward+backward and peak bytes (GPU only) of one case."""
    torch.manual_seed(1)
    layer = build(kind, args).to(ctx.device).train()
    x = torch.randn(1, length, args.dim, device=ctx.device, requires_grad=True)  # B x T x C
    grad = torch.randn_like(x)
    autocast = precision == "bf16"

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=autocast):
            out = layer(x) if kind in IMPLEMENTATIONS else layer(x, None)
        out.backward(grad.to(out.dtype))

    times = time_step(step, ctx.device, args.warmup, args.repeats)
    record = {"median_s": median(times), "times_s": times, "peak_bytes": None}
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)
        base = torch.cuda.memory_allocated(ctx.device)
        step()
        torch.cuda.synchronize(ctx.device)
        record["peak_bytes"] = torch.cuda.max_memory_allocated(ctx.device) - base
    return record


def run_case(ctx: Context, kind: str, length: int, precision: str, args) -> dict:
    case = {"kind": kind, "length": length, "precision": precision}
    why = unavailable(kind, ctx.device, precision == "bf16") if kind in IMPLEMENTATIONS else ""
    if why:
        return {**case, "skipped": why}
    if ctx.seconds_left() <= 0:
        return {**case, "skipped": "skipped: budget spent"}
    try:
        return {**case, **measure(ctx, kind, length, precision, args)}
    except torch.cuda.OutOfMemoryError:
        return {**case, "skipped": "out of GPU memory"}
    except Exception as err:  # one kind failing must not hide the others' figures
        return {**case, "error": f"{type(err).__name__}: {str(err)[:500]}"}
    finally:
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()


def analyse(cases: list[dict], args, precision: str, full: bool) -> dict:
    """The ratio target per T and the linearity of every kind between the shortest and the longest T."""
    timed = {(c["kind"], c["length"]): c for c in cases if c["precision"] == precision and "median_s" in c}
    ratios = {}
    for length in args.lengths:
        windows = [(timed[k, length]["median_s"], k) for k in WINDOW_KINDS if (k, length) in timed]
        strict = timed.get(("cluster-strict", length))
        if windows and strict:
            best, name = min(windows)
            ratios[length] = {"best_window": name, "ratio": strict["median_s"] / best}
    first, last = args.lengths[0], args.lengths[-1]
    growth = {}
    for kind in [*OURS, *IMPLEMENTATIONS]:
        a, b = timed.get((kind, first)), timed.get((kind, last))
        if a and b:
            scale = last / first
            entry = {"time_x": b["median_s"] / a["median_s"], "length_x": scale}
            entry["time_exponent"] = math.log(entry["time_x"]) / math.log(scale)
            if a["peak_bytes"] and b["peak_bytes"]:
                entry["memory_x"] = b["peak_bytes"] / a["peak_bytes"]
            entry["linear"] = all(entry.get(k, 0) <= LINEAR_SLACK * scale for k in ("time_x", "memory_x"))
            growth[kind] = entry
    ratio_ok = all(r["ratio"] <= TARGET_RATIO for r in ratios.values()) if full and ratios else None
    linear_ok = all(growth[k]["linear"] for k in OURS if k in growth) if full and growth else None
    return {"ratios": ratios, "growth": growth, "ratio_target_met": ratio_ok, "linear_target_met": linear_ok}


def run(ctx: Context) -> tuple[dict, str]:
    args = shape(ctx)
    # bf16 is the precision the targets are read in; a budget run measures only that one
    precisions = (["bf16"] if ctx.budget else ["fp32", "bf16"]) if ctx.device.type == "cuda" else ["fp32"]
    cases = [
        run_case(ctx, kind, length, precision, args)
        for precision in precisions
        for kind in [*OURS, *IMPLEMENTATIONS]
        for length in args.lengths
    ]
    full = not ctx.tiny and ctx.device.type == "cuda"
    analysis = {p: analyse(cases, args, p, full) for p in precisions}
    agree = agreement(args.dim, args.heads, args.ffn, args.window, args.lengths[0], ctx.device)
    errors = [f"{c['kind']} T={c['length']} {c['precision']}: {c['error']}" for c in cases if "error" in c]
    # fp32 implementations of one layer agree to float rounding; bf16 FlashAttention to bf16 rounding
    tolerance = {"flex-window": 1e-4, "flash-window": 5e-2}
    errors += [
        f"{k} differs from sdpa-band by {v:.2e}" for k, v in agree.items() if isinstance(v, float) and v > tolerance[k]
    ]
    missing = [k for k in OURS if not any(c["kind"] == k and "median_s" in c for c in cases)]
    errors += [f"{k}: no case ran" for k in missing]
    head = analysis[precisions[-1]]
    worst = max((r["ratio"] for r in head["ratios"].values()), default=float("nan"))
    record = {
        "status": "failed" if errors else "ok",
        "headline": f"{precisions[-1]}: cluster strict / best sliding window <= {worst:.2f}x (target <= "
        f"{TARGET_RATIO}x: {verdict(head['ratio_target_met'])}); our kinds linear in T: "
        f"{verdict(head['linear_target_met'])}",
        "shape": {k: v for k, v in vars(args).items()},
        "cases": cases,
        "references_vs_sdpa_band_max_abs": agree,
        "analysis": {p: {**a, "ratios": {str(t): r for t, r in a["ratios"].items()}} for p, a in analysis.items()},
        "errors": errors,
    }
    agree_line = (
        "References against `sdpa-band` with the same weights (forward, largest absolute difference): "
        + ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k}: {v}" for k, v in agree.items())
    )
    return record, render(cases, analysis, args, precisions) + "\n\n" + agree_line


def render(cases, analysis, args, precisions) -> str:
    parts = [
        __doc__.split("\n\n", 1)[1].strip(),
        f"Shape: C = {args.dim}, {args.heads} heads, FFN {args.ffn}, window {args.window} / stride {args.stride}, "
        f"{args.clusters} clusters, strict mode's {args.groups} groups; T = {', '.join(map(str, args.lengths))}. "
        "`bf16` runs the pass under `torch.autocast(bfloat16)` (what `--amp` does); `fp32` without autocast.",
    ]
    for precision in precisions:
        header = "| kind | " + " | ".join(f"T = {t}: ms / peak MiB" for t in args.lengths) + " |"
        rows = [header, "|" + " --- |" * (len(args.lengths) + 1)]
        for kind in [*OURS, *IMPLEMENTATIONS]:
            cells = []
            for length in args.lengths:
                c = next(c for c in cases if (c["kind"], c["length"], c["precision"]) == (kind, length, precision))
                if "median_s" in c:
                    peak = f"{c['peak_bytes'] / 2**20:.0f}" if c["peak_bytes"] is not None else "n/a (cpu)"
                    cells.append(f"{c['median_s'] * 1000:.2f} / {peak}")
                else:
                    cells.append(c.get("skipped") or f"error: {c['error'][:120]}")
            rows.append(f"| {kind} | " + " | ".join(cells) + " |")
        a = analysis[precision]
        ratio_lines = [
            f"- T = {t}: cluster strict = {r['ratio']:.2f}x of the best sliding window ({r['best_window']})"
            for t, r in a["ratios"].items()
        ]
        growth_lines = [
            f"- {k}: time x{g['time_x']:.2f} (exponent {g['time_exponent']:.2f})"
            + (f", peak memory x{g['memory_x']:.2f}" if "memory_x" in g else "")
            + f" for T x{g['length_x']:.2f}: {'linear' if g['linear'] else 'NOT linear'}"
            for k, g in a["growth"].items()
        ]
        parts += [
            f"## {precision}",
            "\n".join(rows),
            f"Target cluster strict <= {TARGET_RATIO}x of the best sliding-window layer at every T: "
            f"**{verdict(a['ratio_target_met'])}**\n\n" + "\n".join(ratio_lines),
            f"Target every kind of ours linear in T (time and memory growth <= {LINEAR_SLACK}x the growth of T): "
            f"**{verdict(a['linear_target_met'])}**\n\n" + "\n".join(growth_lines),
        ]
    return "\n\n".join(parts)
