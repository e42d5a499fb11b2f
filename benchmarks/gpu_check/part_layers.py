"""Part 4: one layer's forward+backward time and peak memory against T, ours against the GPU's best sliding window.

Our layers are built by ``benchmarks/layer_builder.py`` (the sliding window, the Cluster-Former layer in
strict and paper causality, and strict with ``--long-range-values next``) and run in three variants
(``variants.py``): eager, compiled (``--compile-layers on``) and flex (``--compile-layers on --attention-backend
flex``); the references are ``reference_attention.BandAttentionLayer`` (SDPA with a band mask, FlexAttention,
FlashAttention). Each case runs in this process: warm-up passes (the first compiles a compiled variant for the case's
exact shape, after ``torch._dynamo.reset()``, as a fixed-length training run compiles it), then timed passes (CUDA
events on a GPU), then one pass between ``torch.cuda.reset_peak_memory_stats`` and ``max_memory_allocated`` for the
peak above the layer and its input. A compiled variant's output and input gradient are compared with the eager
layer's on the same input. Dropout is 0 everywhere (FlexAttention and the band references have none). B = 1,
T tokens, C channels.
"""

from __future__ import annotations

import argparse
import math

import torch

from benchmarks.common import peak_bytes, time_step
from benchmarks.gpu_check import kernel_profile, variants
from benchmarks.gpu_check.context import Context, median, verdict
from benchmarks.gpu_check.layers_report import LINEAR_SLACK, TARGET_RATIO, WINDOW_TARGET_RATIO, ratio, render
from benchmarks.gpu_check.reference_attention import IMPLEMENTATIONS, BandAttentionLayer, agreement, unavailable
from benchmarks.layer_builder import build as build_layer

NAME = "layers"
TITLE = "One layer's forward+backward: time and peak memory against T"
OURS = {"window": "window", "cluster-strict": "cluster-strict", "cluster-paper": "cluster-paper"}
OURS["cluster-strict next values"] = "cluster-strict+next"
# the sliding window as a band (--sliding-windows band): the reference's pattern, one FFN pass per token
OURS["window band"] = "window-band"
# the compiled variants of every size's kinds: budget keeps the two the targets name (CPU: plumbing only, one T)
COMPILED_KINDS = {"tiny": ("window", "cluster-strict"), "budget": ("window", "cluster-strict"), "full": tuple(OURS)}
# the compiled variants agree with eager to the precision's rounding (bf16: about 1e-2 relative), or they are wrong
VARIANT_TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}
# expected seconds per size: the eager kinds (8 kinds x T x precisions, 13-23 passes each; budget: 40 s on an H100
# with 1 + 3 passes, 2026-11-27) plus one compile per compiled case (guessed 20 s; budget: 2 kinds x 2 variants x 2
# T = 8 compiles, full: 5 kinds x 2 variants x 3 T in bf16 = 30). The H200's budget run took 122 s (2026-11-28)
ESTIMATE_S = {"tiny": 45, "budget": 45 + 8 * 20, "full": 600 + 30 * 20}
# --layer-kinds and --profile-layers: seconds per case, from the H200's budget run (14 eager cases with 3 + 10
# passes and 8 compiled ones in 122 s: about 1.5 s and 12.5 s); the tiny CPU run takes a few seconds a case
CASE_S = {"tiny": {"eager": 2, "compiled": 4}, "budget": {"eager": 1.5, "compiled": 12.5}}
CASE_S["full"] = {"eager": 3, "compiled": 15}


def chosen_kinds(options: dict) -> list[str] | None:
    """``--layer-kinds``: the display names of the chosen kinds (given by their build names, e.g. cluster-paper,
    cluster-strict+next, window-band), or None for the size's kinds."""
    given = options.get("layer_kinds")
    if not given:
        return None
    by_build = {v: k for k, v in OURS.items()}
    return [by_build[name.strip()] for name in given.split(",") if name.strip()]


def check_options(options: dict) -> None:
    given = [k.strip() for k in (options.get("layer_kinds") or "").split(",") if k.strip()]
    unknown = [k for k in given if k not in OURS.values()]
    if unknown or (options.get("layer_kinds") and not given):
        raise ValueError(f"--layer-kinds {options['layer_kinds']!r}: expected some of {list(OURS.values())}")


def estimate_s(size: str, options: dict) -> float:
    """Expected seconds: ``ESTIMATE_S``, or per case for ``--layer-kinds`` and ``--profile-layers``."""
    kinds = chosen_kinds(options)
    if kinds is None and not options.get("profile_layers"):
        return ESTIMATE_S[size]
    lengths = 3 if size == "full" else 2
    per = CASE_S[size]
    seconds = ESTIMATE_S[size] if kinds is None else 5 + lengths * (len(kinds) + 2) * per["eager"]
    seconds += 0 if kinds is None else lengths * len(kinds) * 2 * per["compiled"]
    return seconds + (len(kernel_profile.PROFILED) * per["compiled"] if options.get("profile_layers") else 0)


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
    return build_layer(base, argparse.Namespace(**{**vars(args), "long_range_values": values or "own"}))


def case_step(ctx: Context, kind: str, variant: str, length: int, precision: str, args):
    """(layer, input, one forward+backward pass, how the variant compiles) of one case."""
    torch.manual_seed(1)
    layer = build(kind, args).to(ctx.device).train()
    compiled_with = "" if kind in IMPLEMENTATIONS else variants.apply(layer.modules(), variant, ctx.device)
    x = torch.randn(1, length, args.dim, device=ctx.device, requires_grad=True)  # B x T x C
    grad = torch.randn_like(x)
    autocast = precision == "bf16"

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=autocast):
            out = layer(x) if kind in IMPLEMENTATIONS else layer(x, None)
        out.backward(grad.to(out.dtype))
        return out.detach().float()

    return layer, x, step, compiled_with


def measure(ctx: Context, kind: str, variant: str, length: int, precision: str, args) -> dict:
    """Median seconds per forward+backward and peak bytes (GPU only) of one case; a compiled variant's difference
    from the eager layer."""
    layer, x, step, compiled_with = case_step(ctx, kind, variant, length, precision, args)
    times = time_step(step, ctx.device, args.warmup, args.repeats)
    record = {"median_s": median(times), "times_s": times}
    if compiled_with:
        record["compiled_with"] = compiled_with
        out, x_grad = step(), x.grad.float()
        variants.apply(layer.modules(), "eager", ctx.device)
        eager_out, eager_grad = step(), x.grad.float()
        record["vs_eager"] = {
            "output": float((out - eager_out).norm() / eager_out.norm()),
            "input_grad": float((x_grad - eager_grad).norm() / eager_grad.norm()),
        }
        variants.apply(layer.modules(), variant, ctx.device)
    record["peak_bytes"] = peak_bytes(step, ctx.device)
    return record


def run_case(ctx: Context, kind: str, variant: str, length: int, precision: str, args, profiled=False) -> dict:
    """One case timed (``measure``), or with ``profiled`` its kernels summarised (``kernel_profile``)."""
    case = {"kind": kind, "variant": variant, "length": length, "precision": precision}
    if kind in IMPLEMENTATIONS:
        why = unavailable(kind, ctx.device, precision == "bf16")
    else:
        why = variants.unavailable(variant, ctx.device)
    if why:
        return {**case, "skipped": why}
    if ctx.seconds_left() <= 0:
        return {**case, "skipped": "skipped: budget spent"}
    variants.reset()  # every compiled case compiles for its own shape, as a fixed-length training run does
    try:
        if profiled:
            step = case_step(ctx, kind, variant, length, precision, args)[2]
            return {**case, "profile": kernel_profile.profile_step(step, ctx.device)}
        return {**case, **measure(ctx, kind, variant, length, precision, args)}
    except torch.cuda.OutOfMemoryError:
        return {**case, "skipped": "out of GPU memory"}
    except Exception as err:  # one kind failing must not hide the others' figures
        return {**case, "error": f"{type(err).__name__}: {str(err)[:500]}"}
    finally:
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()


def plan(ctx: Context, args, precisions: list[str]) -> list[tuple[str, str, int, str]]:
    """(kind, variant, T, precision) of every case: eager kinds and references at every T and precision; the
    compiled variants of the size's kinds in bf16 (fp32 on a CPU), at the first T only on a CPU."""
    size = "tiny" if ctx.tiny else ("budget" if ctx.budget else "full")
    kinds = chosen_kinds(ctx.options)
    cases = [(k, "eager", t, p) for p in precisions for k in [*(kinds or OURS), *IMPLEMENTATIONS] for t in args.lengths]
    lengths = args.lengths[:1] if ctx.device.type != "cuda" else args.lengths
    cases += [
        (kind, variant, length, precisions[-1])
        for kind in (kinds or COMPILED_KINDS[size])
        for variant in ("compiled", "flex")
        for length in lengths
    ]
    return cases


def analyse(cases: list[dict], args, precision: str, full: bool) -> dict:
    """Per T, each of our kinds' variants against FlexAttention's sliding window (the targets: Cluster-Former strict
    <= 1.25x, our sliding window <= 1.1x, each in its fastest variant), and the linearity of every kind and variant
    between the shortest and the longest T."""
    timed = {
        (c["kind"], c["variant"], c["length"]): c for c in cases if c["precision"] == precision and "median_s" in c
    }
    ratios = {}
    for length in args.lengths:
        reference = timed.get(("flex-window", "eager", length))
        if reference is None:
            continue
        row = {}
        for kind in OURS:
            per_variant = {
                v: timed[kind, v, length]["median_s"] / reference["median_s"]
                for v in variants.VARIANTS
                if (kind, v, length) in timed
            }
            if per_variant:
                best = min(per_variant, key=per_variant.get)
                row[kind] = {"ratio": per_variant[best], "best_variant": best, "variants": per_variant}
        ratios[length] = row
    first, last = args.lengths[0], args.lengths[-1]
    growth = {}
    for kind, variant, length in timed:
        a, b = timed.get((kind, variant, first)), timed.get((kind, variant, last))
        if length != first or not (a and b) or first == last:
            continue
        scale = last / first
        entry = {"time_x": b["median_s"] / a["median_s"], "length_x": scale}
        entry["time_exponent"] = math.log(entry["time_x"]) / math.log(scale)
        if a["peak_bytes"] and b["peak_bytes"]:
            entry["memory_x"] = b["peak_bytes"] / a["peak_bytes"]
        entry["linear"] = all(entry.get(k, 0) <= LINEAR_SLACK * scale for k in ("time_x", "memory_x"))
        growth[f"{kind} ({variant})" if variant != "eager" else kind] = entry

    def met(kind: str, bound: float) -> bool | None:
        found = [r[kind]["ratio"] for r in ratios.values() if kind in r]
        return all(v <= bound for v in found) if full and found else None

    ours = [k for k in growth if k.split(" (")[0] in OURS]
    return {
        "ratios": ratios,
        "growth": growth,
        "ratio_target_met": met("cluster-strict", TARGET_RATIO),
        "window_target_met": met("window", WINDOW_TARGET_RATIO),
        "linear_target_met": all(growth[k]["linear"] for k in ours) if full and ours else None,
    }


def run(ctx: Context) -> tuple[dict, str]:
    args = shape(ctx)
    # bf16 is the precision the targets are read in; a budget run measures only that one
    precisions = (["bf16"] if ctx.budget else ["fp32", "bf16"]) if ctx.device.type == "cuda" else ["fp32"]
    # the profile first: with --profile-layers it is the question of the run, the timings of other kinds come after
    profiles = [
        run_case(ctx, kind, variant, args.lengths[-1], precisions[-1], args, profiled=True)
        for kind, variant in (kernel_profile.PROFILED if ctx.options.get("profile_layers") else [])
    ]
    cases = [run_case(ctx, *case, args) for case in plan(ctx, args, precisions)]
    variants.reset()
    full = not ctx.tiny and ctx.device.type == "cuda"
    analysis = {p: analyse(cases, args, p, full) for p in precisions}
    agree = agreement(args.dim, args.heads, args.ffn, args.window, args.lengths[0], ctx.device)
    errors = [
        f"{c['kind']} ({c['variant']}) T={c['length']} {c['precision']}: {c['error']}" for c in cases if "error" in c
    ]
    # fp32 implementations of one layer agree to float rounding; bf16 FlashAttention to bf16 rounding
    tolerance = {"flex-window": 1e-4, "flash-window": 5e-2}
    errors += [
        f"{k} differs from sdpa-band by {v:.2e}" for k, v in agree.items() if isinstance(v, float) and v > tolerance[k]
    ]
    errors += [
        f"{c['kind']} ({c['variant']}) T={c['length']}: {name} differs from eager by {value:.2e} (relative)"
        for c in cases
        for name, value in c.get("vs_eager", {}).items()
        if not value <= VARIANT_TOLERANCE[c["precision"]]
    ]
    errors += [f"profile of {c['kind']} ({c['variant']}): {c['error']}" for c in profiles if "error" in c]
    kinds = chosen_kinds(ctx.options) or list(OURS)
    missing = [k for k in kinds if not any(c["kind"] == k and "median_s" in c for c in cases)]
    errors += [f"{k}: no case ran" for k in missing]
    head = analysis[precisions[-1]]
    worst = {
        kind: max((r[kind]["ratio"] for r in head["ratios"].values() if kind in r), default=float("nan"))
        for kind in ("cluster-strict", "window")
    }
    record = {
        "status": "failed" if errors else "ok",
        "headline": f"{precisions[-1]}, fastest variant / FlexAttention's sliding window: cluster strict <= "
        f"{ratio(worst['cluster-strict'])} (target <= {TARGET_RATIO}x: {verdict(head['ratio_target_met'])}), sliding "
        f"window <= {ratio(worst['window'])} (target <= {WINDOW_TARGET_RATIO}x: {verdict(head['window_target_met'])})"
        f"; linear in T: {verdict(head['linear_target_met'])}",
        "shape": {k: v for k, v in vars(args).items()},
        "cases": cases,
        "profiles": profiles,
        "references_vs_sdpa_band_max_abs": agree,
        "analysis": {p: {**a, "ratios": {str(t): r for t, r in a["ratios"].items()}} for p, a in analysis.items()},
        "errors": errors,
    }
    agree_line = (
        "References against `sdpa-band` with the same weights (forward, largest absolute difference): "
        + ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k}: {v}" for k, v in agree.items())
    )
    markdown = render(cases, analysis, args, precisions, __doc__.split("\n\n", 1)[1].strip()) + "\n\n" + agree_line
    if profiles:
        markdown += "\n\n" + kernel_profile.render(profiles, args.lengths[-1])
    return record, markdown
