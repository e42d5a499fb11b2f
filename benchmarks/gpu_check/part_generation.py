"""Part 5: generated tokens/s of the cached Cluster-Former decoder against fairseq's ``transformer_lm`` at 8k.

Through ``benchmarks/bench_generation.py`` (``build``, ``generate``): the same shape for both models, random weights,
greedy generation (beam 1, batch 1) from a 16-token prompt to exactly L tokens through fairseq's
``SequenceGenerator`` on the device, timed with the device synchronised; rates are L / seconds.
"""

from __future__ import annotations

import argparse
import logging

from benchmarks import bench_generation
from benchmarks.common import prepare_char_data
from benchmarks.gpu_check.context import Context, verdict

NAME = "generation"
TITLE = "Generation tokens/s: cached Cluster-Former decoder against transformer_lm"
MODELS = ("cluster", "transformer_lm")
# expected seconds per size: every token is one Python-driven step of fairseq's generator (~8 ms on a GPU), for
# 2 models x (warm-up + all lengths); budget stops at L = 2,048 instead of 8,192
# budget: 23 s on an H100 (2026-11-27)
ESTIMATE_S = {"tiny": 30, "budget": 30, "full": 300}


def settings(ctx: Context) -> argparse.Namespace:
    if ctx.tiny:
        values = dict(lengths=[32, 64], layers=2, dim=32, heads=2, window=16, clusters=4, long_range_layers="2")
        values.update(prompt=8, warmup=16)
    else:
        values = dict(lengths=[512, 2048] if ctx.budget else [512, 8192], layers=4, dim=512, heads=8, window=256)
        values.update(clusters=64)
        values.update(long_range_layers="2,4", prompt=16, warmup=64)
    return argparse.Namespace(data=prepare_char_data(ctx.work_dir), **values)


def run(ctx: Context) -> tuple[dict, str]:
    args = settings(ctx)
    logging.disable(logging.WARNING)  # fairseq's model-building chatter
    try:
        records = []
        for name in MODELS:
            task, model = bench_generation.build(name, args)
            model = model.to(ctx.device)
            bench_generation.generate(task, model, args.warmup, args.prompt, ctx.device)
            for length in args.lengths:
                seconds = bench_generation.generate(task, model, length, args.prompt, ctx.device)
                records.append({"model": name, "length": length, "seconds": seconds, "tokens_per_s": length / seconds})
            del model
    finally:
        logging.disable(logging.NOTSET)
    rate = {(r["model"], r["length"]): r["tokens_per_s"] for r in records}
    longest = args.lengths[-1]
    speedup = rate["cluster", longest] / rate["transformer_lm", longest]
    # the target is read at 8k: a budget run's shorter L gives its figure without a verdict
    full = not ctx.tiny and not ctx.budget and ctx.device.type == "cuda"
    faster = speedup > 1 if full else None
    record = {
        "status": "ok",
        "headline": f"L = {longest}: cluster {rate['cluster', longest]:.0f} tokens/s, transformer_lm "
        f"{rate['transformer_lm', longest]:.0f} tokens/s ({speedup:.2f}x; faster: {verdict(faster)})",
        "settings": {k: str(v) for k, v in vars(args).items()},
        "records": records,
        "speedup_at_longest": speedup,
        "target_faster_than_transformer_lm": faster,
    }
    rows = ["| model | " + " | ".join(f"L = {n}: tokens/s" for n in args.lengths) + " |"]
    rows.append("|" + " --- |" * (len(args.lengths) + 1))
    rows += [f"| {m} | " + " | ".join(f"{rate[m, n]:.1f}" for n in args.lengths) + " |" for m in MODELS]
    markdown = "\n\n".join(
        [
            __doc__.split("\n\n", 1)[1].strip(),
            f"Shape: {args.layers} layers of {args.dim}, {args.heads} heads, FFN {4 * args.dim}; Cluster-Former "
            f"window {args.window} / stride {args.window // 2}, long-range layers {args.long_range_layers} (strict, "
            f"{args.clusters} clusters); fp32.",
            "\n".join(rows),
            f"At L = {longest} the cached Cluster-Former decoder runs at {speedup:.2f}x the rate of transformer_lm "
            f"(target: faster, {verdict(faster)}).",
        ]
    )
    return record, markdown
