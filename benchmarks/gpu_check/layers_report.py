"""The ``layers`` part's page: the time and peak memory of every case, the targets and the linearity of each kind."""

from __future__ import annotations

import math

from benchmarks.gpu_check.context import verdict

TARGET_RATIO, WINDOW_TARGET_RATIO, LINEAR_SLACK = 1.25, 1.1, 1.25


def ratio(value: float) -> str:
    return "n/a (no FlexAttention timing)" if math.isnan(value) else f"{value:.2f}x"


def cell(c: dict | None) -> str:
    if c is None:
        return ""
    if "median_s" not in c:
        return c.get("skipped") or f"error: {c['error'][:120]}"
    peak = f"{c['peak_bytes'] / 2**20:.0f}" if c["peak_bytes"] is not None else "n/a (cpu)"
    text = f"{c['median_s'] * 1000:.2f} / {peak}"
    if "vs_eager" in c:
        text += f" (vs eager {c['vs_eager']['output']:.0e})"
    return text


def render(cases, analysis, args, precisions, intro: str) -> str:
    """``layers.md`` after its machine line: ``intro`` (what was run), the table per precision, the targets."""
    parts = [
        intro,
        f"Shape: C = {args.dim}, {args.heads} heads, FFN {args.ffn}, window {args.window} / stride {args.stride}, "
        f"{args.clusters} clusters, strict mode's {args.groups} groups; T = {', '.join(map(str, args.lengths))}. "
        "`bf16` runs the pass under `torch.autocast(bfloat16)` (what `--amp` does); `fp32` without autocast. "
        "A compiled variant's cell ends with its output's relative difference from the eager layer's.",
    ]
    for precision in precisions:
        header = "| kind | variant | " + " | ".join(f"T = {t}: ms / peak MiB" for t in args.lengths) + " |"
        rows = [header, "|" + " --- |" * (len(args.lengths) + 2)]
        found = {(c["kind"], c["variant"], c["length"]): c for c in cases if c["precision"] == precision}
        for kind, variant in dict.fromkeys((k, v) for k, v, _ in found):
            cells = [cell(found.get((kind, variant, length))) for length in args.lengths]
            rows.append(f"| {kind} | {variant} | " + " | ".join(cells) + " |")
        a = analysis[precision]
        ratio_lines = [
            f"- T = {t}: {kind} = {r['ratio']:.2f}x ({r['best_variant']}; "
            + ", ".join(f"{v} {x:.2f}x" for v, x in r["variants"].items())
            + ")"
            for t, row in a["ratios"].items()
            for kind, r in row.items()
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
            "Targets, each kind in its fastest variant against FlexAttention's sliding window (`flex-window`) at "
            f"every T: cluster strict <= {TARGET_RATIO}x **{verdict(a['ratio_target_met'])}**; our sliding window <= "
            f"{WINDOW_TARGET_RATIO}x **{verdict(a['window_target_met'])}**\n\n" + "\n".join(ratio_lines),
            f"Target every kind of ours linear in T (time and memory growth <= {LINEAR_SLACK}x the growth of T): "
            f"**{verdict(a['linear_target_met'])}**\n\n" + "\n".join(growth_lines),
        ]
    return "\n\n".join(parts)
