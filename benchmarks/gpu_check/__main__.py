"""`make gpu-check`: every check a GPU should pass and every figure it should give, in one command.

On a CUDA machine (about 55 minutes on one H100) it writes Markdown + JSON per part into ``--out`` (default
``benchmarks/results/gpu/``), each file naming the GPU and its driver:

1. ``tests``: the device-independent tests (those taking the ``device`` fixture) with ``pytest --device cuda``;
2. ``train``: ``fairseq-train`` with ``--fp16``, ``--memory-efficient-fp16`` and ``--amp`` on the paper's layer
   shapes with K-Means refreshes, stopped and resumed: the final weights, centroids and banks must equal an
   uninterrupted run's;
3. ``kmeans``: a 100k x 512 -> 512 refresh with faiss-gpu and torch, and the training stall of a refresh;
4. ``layers``: one layer's forward+backward time and peak memory at T = 3k, 12k, 32k against the best
   sliding-window attention of the GPU (SDPA with a band mask, FlexAttention, FlashAttention);
5. ``generation``: generated tokens/s at 8k against ``transformer_lm``;
6. ``model``: training tokens/s of the 16-layer WikiText-103 LM, Cluster-Former against its sliding-window twin and
   full attention, eager, compiled and with FlexAttention.

On a CPU the same parts run at tiny sizes (a few minutes; the test suite runs it) into a scratch directory. A part
that fails records its error and the others still run; the exit status is 1 if any part failed.

    .venv/bin/python -m benchmarks.gpu_check [--out DIR] [--parts tests,train,...] [--size tiny|budget|full]
        [--budget-minutes N] [--layer-kinds K,...] [--profile-layers] [--train-flags F,...]

A call with ``--parts`` adds its parts to the summary an earlier call into the same ``--out`` wrote.

``--budget-minutes N`` (what ``device_run.sh`` passes for a lent GPU's few minutes): each part module states its
expected seconds per size (``ESTIMATE_S``); the full sizes are kept when all the parts fit in N minutes, else the
cut-down "budget" sizes run. Parts run in the order given; one whose estimate no longer fits in what is left is
recorded as "skipped" (not failed), and subprocesses are stopped when the budget is spent.

``--layer-kinds``, ``--profile-layers`` and ``--train-flags`` narrow the ``layers`` and ``train`` parts to the
questions one lent GPU call can answer (``docs/gpu_speed.md``: the next GPU run); a part whose module has
``estimate_s(size, options)`` states its expected seconds for them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from benchmarks.common import REPO, stopwatch
from benchmarks.gpu_check.context import Context, write_part
from benchmarks.machine import device_info, device_line

# imported when run, so that a part that does not even import is that part's error, not the whole run's
PARTS = {
    name: f"benchmarks.gpu_check.part_{name}" for name in ("tests", "train", "kmeans", "layers", "generation", "model")
}
COMMITTED = REPO / "benchmarks" / "results" / "gpu"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--out", type=Path, help=f"result directory (default: {COMMITTED} on a GPU, a temporary one on a CPU)"
    )
    p.add_argument("--work-dir", type=Path, help="data, checkpoints and logs (default: a temporary directory)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when torch sees a GPU)")
    p.add_argument(
        "--size",
        choices=("auto", "tiny", "budget", "full"),
        default="auto",
        help="auto: tiny on a CPU; on a GPU full, or budget when the full sizes do not fit --budget-minutes",
    )
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {','.join(PARTS)}")
    p.add_argument(
        "--budget-minutes",
        type=float,
        help="run what fits in this many minutes: parts that no longer fit are recorded as skipped (default: no limit)",
    )
    p.add_argument(
        "--layer-kinds",
        help="layers: only these of our kinds, eager, compiled and flex (e.g. cluster-paper,cluster-strict+next)",
    )
    p.add_argument(
        "--profile-layers",
        action="store_true",
        help="layers: first a torch.profiler summary (top kernels) of the compiled and flex layers at the longest T",
    )
    p.add_argument("--train-flags", help="train: only these precision flags (e.g. fp16,amp)")
    args = p.parse_args(argv)
    if args.budget_minutes is not None and args.budget_minutes < 0:
        p.error(f"--budget-minutes {args.budget_minutes:g}: must be >= 0")
    if args.budget_minutes == 0 and args.device != "cpu":  # every part skipped: only a named CPU dry run means it
        p.error(
            "--budget-minutes 0: every part would be skipped and nothing checked; give the minutes the run may use, "
            "or --device cpu for a dry run that only writes the skipped parts' records"
        )
    return args


def options(args) -> dict:
    """The options that narrow parts (``Context.options``), without those left unset."""
    given = {"layer_kinds": args.layer_kinds, "profile_layers": args.profile_layers, "train_flags": args.train_flags}
    return {k: v for k, v in given.items() if v}


def part_estimate(module, size: str, chosen: dict | None = None) -> float:
    """Expected seconds of one part at ``size`` under the options ``chosen`` (a module that did not import: 0)."""
    if module is None:
        return 0
    if hasattr(module, "estimate_s"):
        return module.estimate_s(size, chosen or {})
    return getattr(module, "ESTIMATE_S", {}).get(size, 0)


def estimate(modules: dict, size: str, chosen: dict | None = None) -> float:
    """Expected seconds of the given parts at ``size``."""
    return sum(part_estimate(m, size, chosen) for m in modules.values())


def choose_size(args, device: torch.device, modules: dict) -> str:
    if args.size != "auto":
        return args.size
    if device.type != "cuda":
        return "tiny"
    if args.budget_minutes is None or estimate(modules, "full", options(args)) <= 60 * args.budget_minutes:
        return "full"
    return "budget"


def main(argv=None) -> int:
    args = parse_args(argv)
    name = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: this torch ({torch.__version__}) sees no CUDA device")
    started = time.monotonic()
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"--parts: unknown part(s) {unknown}, expected some of {list(PARTS)}")
    # imported up front for their estimates; a part that does not import reports that error in its own turn
    modules, import_errors = {}, {}
    for part in parts:
        try:
            modules[part] = importlib.import_module(PARTS[part])
        except Exception as err:
            modules[part], import_errors[part] = None, (err, traceback.format_exc())
    chosen = options(args)
    for part, module in modules.items():
        # a mistyped kind or flag is refused before a lent GPU's minutes are spent, naming the option
        check = getattr(module, "check_options", None)
        if check is not None:
            try:
                check(chosen)
            except ValueError as err:
                raise SystemExit(f"{part}: {err}") from None
    size = choose_size(args, device, modules)
    tiny = size == "tiny"
    out = args.out or (COMMITTED if not tiny else Path(tempfile.mkdtemp(prefix="gpu-check-")))
    if (tiny or device.type != "cuda") and out.resolve() == COMMITTED.resolve():
        raise SystemExit(f"--out {out}: CPU or tiny-sized results would replace the GPU's; pass another --out")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpu-check-work-"))
    deadline = None if args.budget_minutes is None else started + 60 * args.budget_minutes
    ctx = Context(out, work, device, tiny, device_info(device), size, deadline, chosen)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    expected = estimate(modules, size, chosen)
    budget = "" if deadline is None else f", budget {args.budget_minutes:g} min (estimate {expected:.0f} s)"
    print(f"gpu-check on {ctx.machine['gpu']} ({size} sizes{budget}) -> {ctx.out_dir}", flush=True)

    # parts of an earlier call into the same --out stay in the summary: a GPU lent for a few minutes at a time runs
    # the parts in several calls (`--parts tests,kmeans,layers`, then `--parts train,generation`)
    earlier = ctx.out_dir / "summary.json"
    summary = json.loads(earlier.read_text())["parts"] if earlier.exists() else {}
    for part in parts:
        module, title = modules[part], part
        expected = part_estimate(module, size, chosen)
        if ctx.seconds_left() < expected or ctx.seconds_left() <= 0:
            # not a failure: the part was not started, so that the run ends inside its budget
            why = f"skipped: budget ({max(ctx.seconds_left(), 0):.0f} s left, the part needs about {expected:.0f} s)"
            record = {"status": "skipped", "headline": why, "estimate_s": expected, "seconds": 0.0}
            write_part(ctx, part, getattr(module, "TITLE", part), record, why)
            summary[part] = {k: record.get(k) for k in ("status", "headline", "error", "seconds")}
            print(f"[{part}] {why}", flush=True)
            continue
        with stopwatch() as took:
            print(f"[{part}] ... (about {expected:.0f} s)" if deadline is not None else f"[{part}] ...", flush=True)
            try:
                if module is None:
                    err, trace = import_errors[part]
                    raise RuntimeError(f"{PARTS[part]} does not import: {type(err).__name__}: {err}\n{trace}")
                title = module.TITLE
                record, markdown = module.run(ctx)
            except Exception as err:  # a part that breaks must not stop the others: its error is its result
                record = {
                    "status": "error",
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc(),
                }
                markdown = f"**Error**: `{record['error']}`\n\n```\n{record['traceback'][-4000:]}\n```"
                print(record["traceback"], file=sys.stderr, flush=True)
        record["seconds"] = round(took.wall, 1)
        write_part(ctx, part, title, record, markdown)
        summary[part] = {k: record.get(k) for k in ("status", "headline", "error", "seconds")}
        print(f"[{part}] {record['status']} in {record['seconds']} s: {record.get('headline') or ''}", flush=True)

    failed = [p for p in parts if summary[p]["status"] not in ("ok", "skipped")]
    skipped = [p for p in parts if summary[p]["status"] == "skipped"]
    record = {"machine": ctx.machine, "size": size, "budget_minutes": args.budget_minutes, "parts": summary}
    (ctx.out_dir / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [
        f"- **{p}** ({r['status']}, {r['seconds']} s): {r.get('headline') or r.get('error') or ''}"
        for p, r in summary.items()
    ]
    given = [] if deadline is None else [f"--budget-minutes {args.budget_minutes:g}"]
    given += [f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in chosen.items()]
    command = (
        "make gpu-check"
        + ("" if ctx.out_dir.resolve() == COMMITTED.resolve() else f" GPU_CHECK_OUT={ctx.out_dir}")
        + (f" GPU_CHECK_ARGS='{' '.join(given)}'" if given else "")
    )
    (ctx.out_dir / "summary.md").write_text(
        f"# gpu-check summary\n\n{device_line(ctx.machine)}\n\n`{command}` ({size} sizes{budget}); "
        f"one file per part beside this one.\n\n" + "\n".join(lines) + "\n"
    )
    ok = len(parts) - len(failed) - len(skipped)
    print(f"gpu-check: {ok} of {len(parts)} parts ok, {len(skipped)} skipped; results in {ctx.out_dir}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
