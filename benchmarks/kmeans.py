"""Centroid refresh time and the training stall it causes.

N = banked states, C = model dim, P = clusters.

Part 1 (``--part refresh``) times one refresh as the refresher computes it: ``ops.kmeans.spherical_kmeans``
(``--iters`` Lloyd iterations) followed by the greedy centroid order, on an N x C bank of random Gaussian states
(unstructured data: nothing converges early), for every C, P and backend, on the CPU and, with ``--device cuda``,
on a GPU.

Part 2 (``--part stall``) measures what one refresh costs the training loop: a fresh interpreter builds fairseq's
``Trainer`` from a parsed fairseq-train command line for a Cluster-Former LM whose long-range layer banks
C = ``--stall-dim`` states, fills the bank to ``--stall-bank`` states, lets the refresh fall due at update
``--stall-interval`` and times every ``Trainer.train_step`` around it. The stall is the excess of the steps from the
snapshot to the install over the median step without refresh work; the refresher's own ``last_stall_seconds`` and
log lines are reported beside it. With ``--kmeans-swap-delay`` 0 the refresh runs inside the training step.

    OMP_NUM_THREADS=2 nice .venv/bin/python -m benchmarks.kmeans --part refresh
    OMP_NUM_THREADS=2 nice .venv/bin/python -m benchmarks.kmeans --part stall --swap-delays 0,4
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.common import append_jsonl, prepare_char_data, read_jsonl, run_worker, stopwatch
from benchmarks.kmeans_report import measured_on, render
from benchmarks.machine import LoadSampler

HERE = Path(__file__).resolve()
PACKAGE = HERE.parent.parent / "fairseq_clusterformer"


def time_refresh(states: torch.Tensor, clusters: int, iters: int, backend: str, seed: int) -> tuple[float, float]:
    """(wall, process CPU) seconds of one refresh: K-Means, then the greedy order."""
    from fairseq_clusterformer.ops.kmeans import order_centroids, spherical_kmeans

    with stopwatch(states.device) as took:
        centroids = order_centroids(spherical_kmeans(states, clusters, iters, seed, backend))
    assert centroids.shape == (clusters, states.size(1))
    return took.wall, took.cpu


def run_refresh(args) -> None:
    results = args.out_dir / "kmeans_refresh.jsonl"
    done = read_jsonl(results) if args.resume else []
    if not args.resume and results.exists():
        results.unlink()
    device = torch.device(args.device)
    for dim in map(int, args.dims.split(",")):
        states = torch.randn(args.bank, dim, generator=torch.Generator().manual_seed(dim)).to(device)  # N x C
        for clusters in map(int, args.clusters.split(",")):
            for backend in args.backends.split(","):
                key = (args.device, dim, clusters, backend)
                if any((r["device"], r["dim"], r["clusters"], r["backend"]) == key for r in done):
                    continue
                with LoadSampler(every_s=2.0) as load:
                    runs = [time_refresh(states, clusters, args.iters, backend, seed) for seed in range(args.repeats)]
                times, cpu = [r[0] for r in runs], [r[1] for r in runs]
                record = {
                    "device": args.device,
                    "bank": args.bank,
                    "dim": dim,
                    "clusters": clusters,
                    "backend": backend,
                    "iters": args.iters,
                    "threads": torch.get_num_threads(),
                    "times_s": times,
                    "median_s": statistics.median(times),
                    "cpu_times_s": cpu,
                    "median_cpu_s": statistics.median(cpu),
                    **load.summary(),
                    "machine": measured_on(),
                }
                print(json.dumps(record), flush=True)
                append_jsonl(results, record)
                done.append(record)


def stall_command(args, swap_delay: int) -> list[str]:
    return [str(args.data), "--user-dir", str(PACKAGE)] + (
        "--task clusterformer_lm --arch clusterformer_lm_enwik8 --decoder-layers 1 --long-range-layers 1 "
        f"--decoder-embed-dim {args.stall_dim} --decoder-ffn-embed-dim {args.stall_dim} --decoder-attention-heads 8 "
        f"--num-clusters {args.stall_clusters} --memory-size {args.stall_bank} "
        f"--cluster-update-interval {args.stall_interval} --kmeans-iters {args.iters} "
        f"--kmeans-backend {args.stall_backend} --kmeans-swap-delay {swap_delay} "
        f"--tokens-per-sample {args.stall_tokens} --sample-break-mode none --batch-size 1 "
        "--required-batch-size-multiple 1 --optimizer adam --lr 0.0001 --max-update 1000000 --num-workers 0 --seed 1 "
        "--no-save --disable-validation --log-format none"
    ).split()


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def stall_worker(args) -> dict:
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    parser = options.get_training_parser()
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(parser, input_args=stall_command(args, args.swap_delay))
    )
    lines = Lines()
    logging.getLogger("fairseq_clusterformer").addHandler(lines)
    logging.getLogger("fairseq_clusterformer").setLevel(logging.INFO)
    torch.manual_seed(1)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    epoch_itr = trainer.get_train_iterator(epoch=1, load_dataset=True)
    trainer.begin_epoch(epoch_itr.epoch)
    batches = epoch_itr.next_epoch_itr(shuffle=False)
    refresher = task.refresher
    steps = []
    last = args.stall_interval + max(args.swap_delay, 1) + args.stall_after
    for _ in range(last):
        update = trainer.get_num_updates()
        started, installed = refresher.refreshes_started, refresher.num_refreshes
        with stopwatch() as took:
            trainer.train_step([next(batches)])
        steps.append(
            {
                "update": update,
                "seconds": took.wall,
                "started": refresher.refreshes_started > started,
                "installed": refresher.num_refreshes > installed,
                "refresher_stall_s": refresher.last_stall_seconds if refresher.num_refreshes > installed else None,
                "bank": len(refresher.banks[0]),
            }
        )
    first = next((s["update"] for s in steps if s["started"]), None)
    end = next((s["update"] for s in steps if s["installed"]), None)
    if first is None or end is None:
        raise SystemExit(f"no refresh started and installed in {last} updates: {lines.lines[-3:]}")
    # normal steps: after the bank is full, before the snapshot, and after the install
    quiet = [s["seconds"] for s in steps if s["update"] >= args.stall_interval // 2 and not first <= s["update"] <= end]
    baseline = statistics.median(quiet)
    window = [s for s in steps if first <= s["update"] <= end]
    return {
        "swap_delay": args.swap_delay,
        "bank_states": window[0]["bank"],
        "median_step_s": baseline,
        "refresh_steps": [(s["update"], round(s["seconds"], 3)) for s in window],
        "stall_max_step_s": max(s["seconds"] - baseline for s in window),
        "stall_total_s": sum(s["seconds"] - baseline for s in window),
        "refresher_stall_s": next(s["refresher_stall_s"] for s in steps if s["installed"]),
        "log": [line for line in lines.lines if "K-Means" in line],
    }


def run_stall(args) -> None:
    results = args.out_dir / "kmeans_stall.jsonl"
    if not args.resume and results.exists():
        results.unlink()
    args.data = prepare_char_data(args.work_dir)
    for delay in map(int, args.swap_delays.split(",")):
        forwarded = [
            "--part",
            "stall",
            "--swap-delay",
            delay,
            "--data",
            args.data,
            "--iters",
            args.iters,
            "--stall-dim",
            args.stall_dim,
            "--stall-clusters",
            args.stall_clusters,
            "--stall-bank",
            args.stall_bank,
            "--stall-interval",
            args.stall_interval,
            "--stall-tokens",
            args.stall_tokens,
            "--stall-after",
            args.stall_after,
            "--stall-backend",
            args.stall_backend,
        ]
        with LoadSampler(every_s=5.0) as load:
            record = run_worker("benchmarks.kmeans", [*map(str, forwarded)], timeout=3600)
        record.update(load.summary(), threads=torch.get_num_threads(), machine=measured_on())
        record["command"] = "fairseq-train " + " ".join(stall_command(args, delay)[1:])
        print(json.dumps(record), flush=True)
        append_jsonl(results, record)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--swap-delay", type=int, help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--part", choices=("refresh", "stall", "render"), default="refresh")
    p.add_argument("--device", default="cpu", help="cpu or cuda (part refresh)")
    p.add_argument("--bank", type=int, default=100_000, help="banked states N")
    p.add_argument("--dims", default="512,1024", help="state dims C")
    p.add_argument("--clusters", default="64,256,512")
    p.add_argument("--backends", default="faiss,torch")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3, help="refreshes per case (different seeds); median reported")
    p.add_argument("--swap-delays", default="0,4", help="--kmeans-swap-delay values of the stall runs")
    p.add_argument("--stall-dim", type=int, default=512)
    p.add_argument("--stall-clusters", type=int, default=512)
    p.add_argument("--stall-bank", type=int, default=100_000, help="--memory-size of the stall runs")
    p.add_argument("--stall-interval", type=int, default=40, help="--cluster-update-interval (bank full before it)")
    p.add_argument("--stall-tokens", type=int, default=3072, help="--tokens-per-sample of the stall runs")
    p.add_argument("--stall-after", type=int, default=4, help="updates timed after the install")
    p.add_argument("--stall-backend", default="torch", help="--kmeans-backend of the stall runs")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/clusterformer-bench"))
    p.add_argument("--out-dir", type=Path, default=HERE.parent / "results")
    p.add_argument("--resume", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(stall_worker(args)), flush=True)
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.part == "refresh":
        run_refresh(args)
    elif args.part == "stall":
        run_stall(args)
    render(args)


if __name__ == "__main__":
    sys.exit(main())
