"""Part 2: the real ``fairseq-train`` in half precision, with K-Means refreshes, stopped and resumed exactly.

For every precision flag: an uninterrupted run to ``updates``, and a run stopped at ``stop`` (while a refresh started
before the stop is still in flight) then resumed from its ``checkpoint_last.pt`` to ``updates``. The two final
``checkpoint_last.pt`` must hold equal model state (weights and centroids) and equal task state (memory banks, the
refresh schedule and the job in flight, in ``extra_state[<task>]`` and ``task_state``). Every run takes PyTorch's
deterministic kernels (``deterministic_train.py``): on a GPU two uninterrupted runs differ in their last bits
otherwise. fairseq 0.12 cannot run ``--fp16`` on a CPU (its optimizer) and ``--amp`` needs CUDA: on a CPU those are
recorded as skipped.
"""

from __future__ import annotations

import re
import shutil

import torch

from benchmarks.common import stopwatch
from benchmarks.gpu_check.context import PACKAGE, REPO, Context, lm_data, markdown_escape, run_tool

NAME = "train"
TITLE = "fairseq-train in half precision: K-Means refreshes, stop and exact resume"
PRECISIONS = ["--fp16", "--memory-efficient-fp16", "--amp"]
# expected seconds per size: full starts fairseq-train 9 times (3 flags x straight, first, resume) for 3 x 600 updates
# of the paper's shapes; budget keeps the 9 starts (~15 s each: imports, CUDA, data) but runs 3 x 80 updates
# budget: 195-224 s on an H100 (2026-11-27, before the math attention backend of deterministic_train.py), 195 s on
# an H200 (2026-11-28)
ESTIMATE_S = {"tiny": 60, "budget": 210, "full": 1200}
# wall-clock durations the task state records (a K-Means job's run time): they differ from run to run by nature
TIMINGS = {"seconds"}
CPU_SKIPS = {"--fp16": "fails inside fairseq 0.12's FP16 optimizer on a CPU", "--amp": "needs CUDA"}
# fairseq-train with torch.use_deterministic_algorithms(True, warn_only=True); cuBLAS reads this before it starts
DETERMINISTIC_TRAIN = REPO / "benchmarks" / "gpu_check" / "deterministic_train.py"
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
# the UserWarnings of an op that ran without a deterministic kernel under warn_only: "<op> does not have a
# deterministic implementation, ..." and, for fused attention, "<backend> defaults to a non-deterministic algorithm"
NONDETERMINISTIC = re.compile(
    r"UserWarning: (\S.*?) (?:does not have a deterministic implementation|defaults to a non-deterministic algorithm)"
)


def flags(options: dict) -> list[str]:
    """The precision flags this run checks: ``--train-flags`` (names without the dashes), else all of them."""
    given = options.get("train_flags")
    return [f"--{name.strip().lstrip('-')}" for name in given.split(",") if name.strip()] if given else PRECISIONS


def check_options(options: dict) -> None:
    chosen = flags(options)
    unknown = [f for f in chosen if f not in PRECISIONS]
    if unknown or not chosen:
        raise ValueError(f"--train-flags {options.get('train_flags')!r}: expected some of {PRECISIONS}")


def estimate_s(size: str, options: dict) -> float:
    """Expected seconds: ``ESTIMATE_S`` covers every flag, each flag a third of it."""
    return ESTIMATE_S[size] * len(flags(options)) / len(PRECISIONS)


def schedule(ctx: Context) -> tuple[list[str], int, int]:
    """(fairseq-train arguments without the data and precision, updates, stop)."""
    common = ["--user-dir", PACKAGE, "--task", "clusterformer_lm", "--sample-break-mode", "none", "--optimizer", "adam"]
    common += ["--num-workers", "0", "--seed", "3", "--log-format", "simple", "--log-interval", "1"]
    common += ["--no-epoch-checkpoints", "--disable-validation", "--required-batch-size-multiple", "1"]
    if ctx.tiny:
        updates, stop = 8, 4
        shape = ["--arch", "clusterformer_lm_tiny", "--tokens-per-sample", "200", "--batch-size", "4", "--lr", "0.003"]
        refresh = ["--memory-size", "2000", "--memory-sample-per-batch", "300", "--kmeans-iters", "10"]
        refresh += ["--cluster-update-interval", "3", "--kmeans-swap-delay", "2"]  # starts at 3 and 6; in flight at 4
    else:
        # the paper's enwik8 layer shapes (512 dims, 8 heads, FFN 2048, windows 256 / stride 128, 3,072 tokens),
        # 4 layers of which 2 are Cluster-Former layers with 512 clusters
        updates, stop = (40, 28) if ctx.budget else (300, 148)
        shape = ["--arch", "clusterformer_lm_enwik8", "--decoder-layers", "4", "--long-range-layers", "2,4"]
        shape += ["--num-clusters", "512", "--window-size", "256", "--window-stride", "128"]
        shape += ["--tokens-per-sample", "3072", "--batch-size", "2", "--lr", "0.0005"]
        shape += ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50", "--clip-norm", "0.5"]
        refresh = ["--memory-size", "20000", "--memory-sample-per-batch", "2048", "--kmeans-iters", "10"]
        # a refresh starts at every multiple of the interval and installs 4 updates later: in flight at the stop
        interval = "13" if ctx.budget else "73"  # budget: 26 starts, installs at 30; full: 146 starts, installs at 150
        refresh += ["--cluster-update-interval", interval, "--kmeans-swap-delay", "4"]
    return [*common, *shape, *refresh, "--save-interval-updates", str(stop)], updates, stop


def equal(a, b, path: str = "") -> list[str]:
    """The paths at which two checkpoint entries differ (tensors bit for bit, containers recursively)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
        if same and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()):
            return []
        if same and a.is_floating_point() and b.is_floating_point():  # how far apart: last bits, or a real fault
            return [f"{path or '.'} (max |diff| {(a.double() - b.double()).abs().max().item():.2g})"]
        return [path or "."]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(map(str, a.keys() ^ b.keys()))}"]
        return [d for k in a if k not in TIMINGS for d in equal(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} and {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in equal(x, y, f"{path}[{i}]")]
    return [] if a == b else [path or "."]


def compare(straight_path, resumed_path) -> dict:
    """Differences of the model state and the task state of two checkpoints (and, for information, the optimizer)."""
    a = torch.load(straight_path, map_location="cpu", weights_only=False)
    b = torch.load(resumed_path, map_location="cpu", weights_only=False)
    tasks = sorted(k for k in a["extra_state"] if k.endswith("Task"))
    centroids = [k for k in a["model"] if k.endswith("centroids")]
    return {
        "model": equal(a["model"], b["model"], "model"),
        "task": equal(a.get("task_state"), b.get("task_state"), "task_state")
        + [d for k in tasks for d in equal(a["extra_state"][k], b["extra_state"].get(k), f"extra_state/{k}")],
        "optimizer": equal(a.get("last_optimizer_state"), b.get("last_optimizer_state"), "optimizer"),
        "centroid_tensors": len(centroids),
        "task_entries": tasks,
    }


def last_log(out: str) -> dict:
    """The last train_inner record: loss, update, K-Means refreshes so far."""
    lines = re.findall(r"train_inner \| (.*)", out)
    if not lines:
        return {}
    fields = dict(item.split("=", 1) for item in re.split(r",\s*", lines[-1].split("|", 1)[-1].strip()) if "=" in item)
    return {k: fields.get(k) for k in ("num_updates", "loss", "kmeans_refreshes", "loss_scale", "ups", "wps")}


def run_precision(ctx: Context, data, flag: str) -> dict:
    args, updates, stop = schedule(ctx)
    base = ctx.work_dir / "train" / flag.strip("-")
    shutil.rmtree(base, ignore_errors=True)  # fairseq-train would resume from an earlier run's checkpoint_last.pt
    runs = {"straight": (updates, "straight"), "first": (stop, "resumed"), "resume": (updates, "resumed")}
    record = {"flag": flag, "updates": updates, "stop": stop}
    unguarded: set[str] = set()  # ops that ran without a deterministic kernel, from PyTorch's warnings
    for name, (max_update, save) in runs.items():
        command = ["python", DETERMINISTIC_TRAIN, data, *args, flag, "--max-update", str(max_update)]
        with stopwatch() as took:
            code, out = run_tool(
                [*command, "--save-dir", base / save], base / f"{name}.log", ctx.timeout(1800), DETERMINISTIC_ENV
            )
        record[name] = {"exit_code": code, "seconds": round(took.wall, 1), **last_log(out)}
        unguarded.update(NONDETERMINISTIC.findall(out))
        record["nondeterministic_ops"] = sorted(unguarded)
        if code != 0:
            record["error"] = f"{name} run exited {code}: " + " | ".join(out.strip().splitlines()[-4:])
            return record
        if name == "resume":
            # a resume that silently started from scratch would also end equal: it must have loaded the stop
            record["resumed_at_stop"] = (
                re.search(rf"checkpoint_last\.pt \(epoch \d+ @ {stop} updates\)", out) is not None
            )
            record["not_exact_warning"] = "not exact" in out
    shown = " ".join(map(str, args)).replace(str(PACKAGE), "fairseq_clusterformer")
    record["command"] = f"python benchmarks/gpu_check/deterministic_train.py DATA {shown}"
    diff = compare(base / "straight" / "checkpoint_last.pt", base / "resumed" / "checkpoint_last.pt")
    record["differences"] = {k: len(diff[k]) for k in ("model", "task", "optimizer")}
    diff.update({k: diff[k][:20] for k in ("model", "task", "optimizer")})  # the first ones name the problem
    refreshes = record["straight"].get("kmeans_refreshes")
    record["refreshed"] = refreshes is not None and float(refreshes) > 0
    same = not diff["model"] and not diff["task"] and not record["not_exact_warning"]
    record.update(diff, identical=same and record["resumed_at_stop"] and record["refreshed"])
    return record


def run(ctx: Context) -> tuple[dict, str]:
    data = lm_data(ctx)
    results = []
    per_flag = ESTIMATE_S[ctx.size or ("tiny" if ctx.tiny else "full")] / len(PRECISIONS)
    for flag in flags(ctx.options):
        if ctx.device.type != "cuda" and flag in CPU_SKIPS:
            results.append({"flag": flag, "skipped": f"skipped on cpu: {CPU_SKIPS[flag]}"})
            continue
        if ctx.seconds_left() < per_flag:
            results.append({"flag": flag, "skipped": f"skipped: budget ({max(ctx.seconds_left(), 0):.0f} s left)"})
            continue
        results.append(run_precision(ctx, data, flag))
    ran = [r for r in results if "skipped" not in r]
    ok = bool(ran) and all(r.get("identical") for r in ran)
    # every chosen flag skipped on this device (--train-flags fp16 on a CPU): nothing checked, nothing failed
    status = "ok" if ok else "skipped" if not ran and all("on cpu" in r["skipped"] for r in results) else "failed"
    rows = []
    for r in results:
        if "skipped" in r:
            rows.append(f"| `{r['flag']}` | {r['skipped']} | | | | |")
            continue
        if "error" in r:
            rows.append(f"| `{r['flag']}` | **error**: {markdown_escape(r['error'][-400:])} | | | | |")
            continue
        s, p = r["straight"], r["resume"]
        verdict = "**identical**" if r["identical"] else "**DIFFERENT**"
        n = r["differences"]
        detail = f"entries that differ: model {n['model']}, task {n['task']}; optimizer state {n['optimizer']}"
        rows.append(
            f"| `{r['flag']}` | {verdict} ({detail}) | {s.get('loss')} / {p.get('loss')} | {s.get('kmeans_refreshes')} "
            f"| {s['seconds']} / {r['first']['seconds']} + {p['seconds']} | {s.get('ups')} |"
        )
    table = "\n".join(
        [
            "| flag | resume vs uninterrupted (final checkpoint_last.pt) | final loss (straight / resumed) "
            "| K-Means refreshes | seconds (straight / first + resume) | updates/s |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
        ]
    )
    differences = [
        f"- `{r['flag']}`: {', '.join((r['model'] + r['task'])[:8])}" for r in ran if r.get("model") or r.get("task")
    ]
    command = next((r["command"] for r in ran if "command" in r), "")
    headline = ", ".join(
        f"{r['flag']} "
        + (
            r["skipped"]
            if "skipped" in r
            else "error"
            if "error" in r
            else "resume identical"
            if r["identical"]
            else "resume DIFFERENT"
        )
        for r in results
    )
    record = {"status": status, "headline": headline, "runs": results}
    markdown = [
        __doc__.split("\n\n", 1)[1].strip(),
        f"Each run: `{command} <flag> --max-update N --save-dir DIR`; stopped after update "
        f"{ran[0]['stop'] if ran else '?'}, {ran[0]['updates'] if ran else '?'} updates in all.",
        table,
    ]
    if differences:
        markdown.append("Entries that differ:\n\n" + "\n".join(differences))
    unguarded = sorted({op for r in ran for op in r.get("nondeterministic_ops", [])})
    markdown.append(
        "Ops that ran without a deterministic kernel (PyTorch's warn_only warnings): "
        + (", ".join(f"`{markdown_escape(op)}`" for op in unguarded) if unguarded else "none")
        + "."
    )
    return record, "\n\n".join(markdown)
