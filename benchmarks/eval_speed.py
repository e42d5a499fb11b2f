"""fairseq-eval-lm tokens/s of a Cluster-Former LM against the sliding-window LM.

T = tokens per evaluated block, W = context window.

For every model the script trains a real checkpoint with ``fairseq-train`` for ``--updates`` updates (with a K-Means
refresh after ``--refresh-at`` updates, so the cluster model evaluates with centroids from K-Means, not the random
initial ones), then runs plain ``fairseq-eval-lm --context-window W`` on the first ``--eval-bytes`` bytes of the
held-out text ``--repeats`` times and reports the median of the tokens/s it prints. Data: Tiny Shakespeare read as
bytes (enwik8's format); models: ``clusterformer_lm_enwik8`` at the width given by the flags.

    OMP_NUM_THREADS=1 nice .venv/bin/python -m benchmarks.eval_speed --dim 256
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import append_jsonl, console_script, markdown_table, prepare_char_data, read_jsonl
from benchmarks.machine import LoadSampler, machine_info

HERE = Path(__file__).resolve()
PACKAGE = HERE.parent.parent / "fairseq_clusterformer"
EVALUATED = re.compile(r"Evaluated ([\d,]+) tokens in ([\d.]+)s \(([\d.]+) tokens/s\)")
LOSS = re.compile(r"Loss \(base 2\): ([\d.]+)")


def run(command: list[str], log: Path) -> str:
    proc = subprocess.run(command, capture_output=True, text=True)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{Path(command[0]).name} failed ({proc.returncode}), see {log}")
    return proc.stdout + proc.stderr


def eval_data(work_dir: Path, eval_bytes: int) -> Path:
    """The first ``eval_bytes`` lines' worth of the held-out bytes, binarised with the training dictionary."""
    full = prepare_char_data(work_dir)
    dest = work_dir / f"chars-eval-{eval_bytes}"
    if (dest / "test.bin").exists():
        return dest
    source = work_dir / "chars-text" / "test.txt"
    kept, size = [], 0
    for line in source.read_text().splitlines(keepends=True):
        if size >= eval_bytes:
            break
        kept.append(line)
        size += len(line.split()) + 1  # one token per byte, plus the line's newline byte
    (work_dir / "chars-eval.txt").write_text("".join(kept))
    subprocess.run(
        [
            console_script("fairseq-preprocess"),
            "--only-source",
            "--srcdict",
            str(full / "dict.txt"),
            "--testpref",
            str(work_dir / "chars-eval.txt"),
            "--destdir",
            str(dest),
            "--workers",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    return dest


def model_flags(model: str, args) -> list[str]:
    base, _, merge = model.partition(":")
    long_range, _, causality = base.partition("-")
    flags = (
        f"--task clusterformer_lm --arch clusterformer_lm_enwik8 --long-range-layer {long_range} "
        f"--cluster-causality {causality or 'strict'} --num-clusters {args.clusters} --decoder-layers {args.layers} "
        f"--decoder-embed-dim {args.dim} --decoder-ffn-embed-dim {4 * args.dim} --decoder-attention-heads {args.heads}"
    ).split()
    if args.long_range_layers:
        flags += ["--long-range-layers", args.long_range_layers]
    return flags + (["--window-merge", merge] if merge else [])


def train(model: str, data: Path, args) -> Path:
    save = args.work_dir / "eval-speed" / model.replace(":", "_")
    checkpoint = save / "checkpoint_last.pt"
    if checkpoint.exists() and args.reuse:
        return checkpoint
    shutil.rmtree(save, ignore_errors=True)  # fairseq-train would resume from an old checkpoint_last.pt
    save.mkdir(parents=True)
    command = [console_script("fairseq-train"), str(data), "--user-dir", str(PACKAGE), *model_flags(model, args)]
    command += (
        f"--tokens-per-sample {args.train_tokens} --max-target-positions {args.tokens} --sample-break-mode none "
        f"--batch-size 1 --optimizer adam --lr 0.0005 --max-update {args.updates} "
        f"--memory-size {args.train_tokens * args.refresh_at} --cluster-update-interval {args.refresh_at} "
        # install the refresh's centroids in the training step itself, so the short run ends with them
        "--kmeans-swap-delay 0 "
        "--num-workers 0 --seed 1 --no-epoch-checkpoints --disable-validation --log-format simple"
    ).split()
    run([*command, "--save-dir", str(save)], save / "train.log")
    return checkpoint


def evaluate(checkpoint: Path, data: Path, args) -> tuple[float, int, float]:
    command = [console_script("fairseq-eval-lm"), str(data), "--user-dir", str(PACKAGE), "--path", str(checkpoint)]
    command += (
        f"--gen-subset test --tokens-per-sample {args.tokens} --context-window {args.context_window} --batch-size 1 "
        "--num-workers 0"
    ).split()
    out = run(command, checkpoint.parent / "eval.log")
    match, loss = EVALUATED.search(out), LOSS.search(out)
    if not match or not loss:
        raise SystemExit(f"no 'Evaluated ... tokens/s' line in {checkpoint.parent / 'eval.log'}")
    return float(match.group(3)), int(match.group(1).replace(",", "")), float(loss.group(1))


def run_all(args) -> None:
    results = args.out_dir / "eval_speed.jsonl"
    if results.exists():
        results.unlink()
    train_data = prepare_char_data(args.work_dir)
    test_data = eval_data(args.work_dir, args.eval_bytes)
    checkpoints = {model: train(model, train_data, args) for model in args.models.split(",")}
    runs: dict[str, list[tuple[float, int, float]]] = {model: [] for model in checkpoints}
    with LoadSampler(every_s=5.0) as load:
        for _ in range(args.repeats):  # interleaved, so that a change of the machine's load hits every model
            for model, checkpoint in checkpoints.items():
                runs[model].append(evaluate(checkpoint, test_data, args))
    for model, measured in runs.items():
        record = {
            "model": model,
            "tokens_per_s": [m[0] for m in measured],
            "median_tokens_per_s": statistics.median(m[0] for m in measured),
            "tokens": measured[0][1],
            "loss_base2": measured[0][2],
            "layers": args.layers,
            "dim": args.dim,
            "T": args.tokens,
            "context_window": args.context_window,
            "updates": args.updates,
            **load.summary(),
            "eval_command": f"fairseq-eval-lm DATA --user-dir {PACKAGE} --path {checkpoints[model]} --gen-subset test "
            f"--tokens-per-sample {args.tokens} --context-window {args.context_window} --batch-size 1 --num-workers 0",
        }
        print(json.dumps(record), flush=True)
        append_jsonl(results, record)


def render(args) -> str:
    records = read_jsonl(args.out_dir / "eval_speed.jsonl")
    if not records:
        raise SystemExit("no results yet: run the benchmark first")
    info = machine_info()
    base = next((r for r in records if r["model"] == "none"), None)
    rows = []
    for r in records:
        rel = f"{r['median_tokens_per_s'] / base['median_tokens_per_s']:.3f}" if base else ""
        rows.append(
            [
                r["model"],
                r["tokens"],
                f"{r['median_tokens_per_s']:.1f}",
                rel,
                " / ".join(f"{v:.1f}" for v in r["tokens_per_s"]),
                f"{r['loss_base2']:.3f}",
            ]
        )
    first = records[0]
    text = (
        f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}; 1-minute load average during the "
        f"evaluations: min {first['load_min']:.2f}, median {first['load_median']:.2f}, max {first['load_max']:.2f}.\n\n"
        f"Models: {first['layers']} layers, dim {first['dim']}, trained {first['updates']} updates; evaluation "
        f"blocks of {first['T']} tokens, context window {first['context_window']}.\n\n"
        + markdown_table(["model", "tokens scored", "tokens/s (median)", "vs none", "each run", "loss (base 2)"], rows)
    )
    (args.out_dir / "eval_speed.md").write_text(text + "\n")
    print(text)
    return text


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="none,cluster", help="none = sliding window; cluster[-paper][:attention]; ...")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--long-range-layers", default="", help="default: the arch's 11,15")
    p.add_argument("--dim", type=int, default=512, help="model width (enwik8: 512); shrink it on a small CPU")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--clusters", type=int, default=512)
    p.add_argument("--tokens", type=int, default=3072, help="--tokens-per-sample of the evaluation")
    p.add_argument("--context-window", type=int, default=2048)
    p.add_argument("--train-tokens", type=int, default=512, help="--tokens-per-sample of the short training run")
    p.add_argument("--updates", type=int, default=12)
    p.add_argument("--refresh-at", type=int, default=8, help="--cluster-update-interval (and bank size in segments)")
    p.add_argument("--eval-bytes", type=int, default=8000, help="bytes of held-out text to evaluate")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/clusterformer-bench"))
    p.add_argument("--out-dir", type=Path, default=HERE.parent / "results")
    p.add_argument("--reuse", action="store_true", help="reuse checkpoints a previous run trained")
    p.add_argument("--render-only", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not args.render_only:
        run_all(args)
    render(args)


if __name__ == "__main__":
    sys.exit(main())
