"""Training tokens/s and peak memory of whole language models through fairseq's own training step.

T = tokens per sample, C = model dim, F = FFN dim, H = heads, l = window size.

Each (model, T) case runs in a fresh interpreter (``--worker``) that parses a real fairseq-train command line
(``options.parse_args_and_arch``), builds the task, model, criterion and ``fairseq.trainer.Trainer`` from it, and
times ``Trainer.train_step`` on consecutive batches of one T-token segment (batch 1) from the real data iterator:
forward, backward, Adam update, and for Cluster-Former models the task's memory-bank hook. Peak memory is the
worker's peak resident set above its footprint once the trainer was built (see ``common``).

Models (``--models``): ``transformer_lm`` is fairseq's own full-attention LM of the same shape; the others are
``clusterformer_lm_enwik8`` with ``--long-range-layer`` set to the name's first part (``none`` = sliding window
everywhere), ``-paper`` for ``--cluster-causality paper``, ``:attention`` for ``--window-merge attention``.
The data are Tiny Shakespeare read as bytes (enwik8's format; enwik8 itself is not on this machine).

    OMP_NUM_THREADS=1 nice .venv/bin/python -m benchmarks.model_throughput --dim 256 --lengths 3072
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.common import (
    GIB,
    MIB,
    append_jsonl,
    markdown_table,
    peak_rss,
    prepare_char_data,
    read_jsonl,
    reset_peak_rss,
    run_worker,
    stopwatch,
    timed_repeats,
)
from benchmarks.machine import LoadSampler, machine_info

HERE = Path(__file__).resolve()
PACKAGE = HERE.parent.parent / "fairseq_clusterformer"


def train_command(model: str, length: int, args) -> list[str]:
    """The fairseq-train arguments of one case (what ``fairseq-train`` would be given)."""
    command = [str(args.data), "--user-dir", str(PACKAGE)] + (
        f"--tokens-per-sample {length} --sample-break-mode none --batch-size 1 --required-batch-size-multiple 1 "
        "--optimizer adam --lr 0.0001 --max-update 1000000 --num-workers 0 --seed 1 --no-save --disable-validation "
        f"--log-format none --decoder-layers {args.layers} --decoder-embed-dim {args.dim} "
        f"--decoder-ffn-embed-dim {args.ffn or 4 * args.dim} --decoder-attention-heads {args.heads} "
        # transformer_lm's input and output dims default to 512 whatever the width: pin them to it
        f"--decoder-input-dim {args.dim} --decoder-output-dim {args.dim}"
    ).split()
    if model == "transformer_lm":
        # clusterformer_lm_enwik8's settings, on fairseq's own transformer_lm
        return (
            command
            + (
                "--task language_modeling --arch transformer_lm --decoder-normalize-before "
                "--share-decoder-input-output-embed --dropout 0.3 --attention-dropout 0.1 --activation-dropout 0.1"
            ).split()
        )
    base, _, merge = model.partition(":")
    long_range, _, causality = base.partition("-")
    command += (
        f"--task clusterformer_lm --arch clusterformer_lm_enwik8 --long-range-layer {long_range} "
        f"--cluster-causality {causality or 'strict'} --num-clusters {args.clusters} --memory-size 100000 "
        f"--window-size {args.window} --window-stride {args.window // 2}"
    ).split()
    if args.long_range_layers:
        command += ["--long-range-layers", args.long_range_layers]
    return command + (["--window-merge", merge] if merge else [])


def worker(args) -> dict:
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    logging.disable(logging.WARNING)
    parser = options.get_training_parser()
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(parser, input_args=train_command(args.model, args.length, args))
    )
    torch.manual_seed(1)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    epoch_itr = trainer.get_train_iterator(epoch=1, load_dataset=True)
    trainer.begin_epoch(epoch_itr.epoch)
    batches = epoch_itr.next_epoch_itr(shuffle=False)
    if len(batches) < args.warmup + args.steps:
        raise SystemExit(f"only {len(batches)} segments of {args.length} tokens in the training data")
    baseline = reset_peak_rss()
    wall, cpu = timed_repeats(lambda: trainer.train_step([next(batches)]), args.warmup, args.steps)
    return {
        "model": args.model,
        "length": args.length,
        "params": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "wall_times_s": wall,
        "cpu_times_s": cpu,
        "median_s": statistics.median(cpu),
        "median_wall_s": statistics.median(wall),
        "tokens_per_s": args.length / statistics.median(cpu),
        "tokens_per_wall_s": args.length / statistics.median(wall),
        "peak_bytes": peak_rss() - baseline,
    }


def estimate_bytes(model: str, length: int, done: list[dict], args) -> float:
    """Expected peak: the same model's largest measured T scaled (linearly, or quadratically for full attention),
    else a generous estimate of the activations kept for backward."""
    power = 2 if model == "transformer_lm" else 1
    measured = [r for r in done if r["model"] == model and "peak_bytes" in r and r["length"] < length]
    if measured:
        last = max(measured, key=lambda r: r["length"])
        return 1.1 * last["peak_bytes"] * (length / last["length"]) ** power
    ffn = args.ffn or 4 * args.dim
    per_token = 4 * (2 * (12 * args.dim + 3 * ffn) + 6 * args.heads * args.window)  # two windows per token
    quadratic = 4 * (1 + 3 * args.heads) * length**2 if model == "transformer_lm" else 0
    return 1.3 * args.layers * (per_token * length + quadratic)


def run_all(args) -> None:
    results = args.out_dir / "model_throughput.jsonl"
    done = read_jsonl(results) if args.resume else []
    if not args.resume and results.exists():
        results.unlink()
    args.data = prepare_char_data(args.work_dir)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)  # resident set tracks live tensors (see benchmarks/common.py)
    shape = {
        "layers": args.layers,
        "dim": args.dim,
        "ffn": args.ffn or 4 * args.dim,
        "heads": args.heads,
        "long_range_layers": args.long_range_layers or "11,15 (arch default)",
        "clusters": args.clusters,
    }
    forwarded = [
        "--layers",
        args.layers,
        "--dim",
        args.dim,
        "--ffn",
        args.ffn,
        "--heads",
        args.heads,
        "--window",
        args.window,
        "--clusters",
        args.clusters,
        "--long-range-layers",
        args.long_range_layers,
        "--data",
        args.data,
        "--warmup",
        args.warmup,
        "--steps",
        args.steps,
    ]
    for length in sorted(int(v) for v in args.lengths.split(",")):
        for model in args.models.split(","):
            if any(r["model"] == model and r["length"] == length and r.get("shape") == shape for r in done):
                continue
            need = estimate_bytes(model, length, [r for r in done if r.get("shape") == shape], args)
            record = {"model": model, "length": length, "shape": shape, "estimate_bytes": need}
            if need > args.budget_gib * GIB:
                record["skipped"] = f"does not fit in {args.budget_gib:g} GiB budget (estimated {need / GIB:.1f} GiB)"
            else:
                with LoadSampler(every_s=5.0) as load:
                    with stopwatch() as took:
                        worker_args = [*map(str, forwarded), "--model", model, "--length", str(length)]
                        record.update(run_worker("benchmarks.model_throughput", worker_args, args.timeout_s))
                    record["wall_s"] = took.wall
                record.update(load.summary())
            record["command"] = "fairseq-train " + " ".join(train_command(model, length, args)[1:])
            print(json.dumps(record), flush=True)
            append_jsonl(results, record)
            done.append(record)


def render(args) -> str:
    records = read_jsonl(args.out_dir / "model_throughput.jsonl")
    if not records:
        raise SystemExit("no results yet: run the benchmark first")
    info = machine_info()
    sections = [f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}."]
    shapes = list({json.dumps(r["shape"], sort_keys=True): r["shape"] for r in records}.values())
    for shape in shapes:
        cases = {(r["model"], r["length"]): r for r in records if r["shape"] == shape}
        rows = []
        for (model, length), r in cases.items():
            base = cases.get(("none", length), {})
            both = "tokens_per_s" in r and "tokens_per_s" in base
            rel = f"{r['tokens_per_s'] / base['tokens_per_s']:.3f}" if both else ""
            rel_wall = f"{r['tokens_per_wall_s'] / base['tokens_per_wall_s']:.3f}" if both else ""
            if "tokens_per_s" in r:
                load = f"{r['load_median']:.1f} ({r['load_min']:.1f}-{r['load_max']:.1f})"
                rows.append(
                    [
                        model,
                        length,
                        f"{r['params'] / 1e6:.2f}",
                        f"{r['tokens_per_s']:.0f}",
                        rel,
                        f"{r['tokens_per_wall_s']:.0f}",
                        rel_wall,
                        f"{r['median_s']:.2f}",
                        f"{r['peak_bytes'] / MIB:.0f}",
                        load,
                    ]
                )
            else:
                rows.append([model, length, "", r.get("skipped") or r.get("error"), "", "", "", "", "", ""])
        sections.append(
            f"Shape: {shape['layers']} layers, dim {shape['dim']}, FFN {shape['ffn']}, {shape['heads']} heads, "
            f"long-range layers {shape['long_range_layers']}, {shape['clusters']} clusters, batch 1.\n\n"
            + markdown_table(
                [
                    "model",
                    "T",
                    "params (M)",
                    "train tokens per CPU-s",
                    "vs none",
                    "train tokens per wall-s",
                    "vs none (wall)",
                    "CPU s / update (median)",
                    "peak MiB",
                    "load avg (min-max)",
                ],
                rows,
            )
        )
    text = "\n\n".join(sections)
    (args.out_dir / "model_throughput.md").write_text(text + "\n")
    print(text)
    return text


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--models", default="transformer_lm,none,cluster")
    p.add_argument("--lengths", default="3072,12288")
    p.add_argument("--layers", type=int, default=16, help="decoder layers (the enwik8 model has 16)")
    p.add_argument("--long-range-layers", default="", help="e.g. 3,4 with --layers 4 (default: the arch's 11,15)")
    p.add_argument("--dim", type=int, default=512, help="model width (enwik8: 512); shrink it on a small CPU")
    p.add_argument("--ffn", type=int, default=0, help="FFN width (default 4 x --dim)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--window", type=int, default=256, help="window size l (stride l/2)")
    p.add_argument("--clusters", type=int, default=512)
    p.add_argument("--warmup", type=int, default=1, help="untimed updates first")
    p.add_argument("--steps", type=int, default=3, help="timed updates (the median is reported)")
    p.add_argument("--budget-gib", type=float, default=8.0, help="skip cases estimated above this much memory")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="give up on one case after this long")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/clusterformer-bench"), help="binarised data go here")
    p.add_argument("--out-dir", type=Path, default=HERE.parent / "results")
    p.add_argument("--resume", action="store_true", help="keep the results file and run only the missing cases")
    p.add_argument("--render-only", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not args.render_only:
        run_all(args)
    render(args)


if __name__ == "__main__":
    sys.exit(main())
