"""What bfloat16 gains on this CPU: the float32 and bfloat16 matrix-product rates, one layer's forward + backward per
kind (float32, bfloat16 autocast, compiled; attention dropout 0.1 and 0), one QA training update and one LM training
update in both precisions, each also as a share of the machine's measured peak (linear-layer FLOPs / time).
On a CPU without native bfloat16 the layer rows time torch's own bfloat16 kernels (what bfloat16 itself costs there)
and the update rows time what ``--autocast-bf16`` runs, its products through float32 kernels (``--bf16-products
auto``).

    OMP_NUM_THREADS=1 python -m benchmarks.cpu_bf16 [--qa-data DIR --qa-encoder DIR] [--lm-data DIR] [--compiled]
        [--json out.json] [--markdown out.md]

Times are CPU seconds of this process (one thread: other processes' load lengthens the wall time, not these), the best
of ``--repeats`` passes after a warm-up. ``--qa-data`` / ``--qa-encoder``: a binarised whole-article SQuAD folder and
the imported encoder (``examples/qa/cpu_pretrained.sh --contexts article --prepare-only --out DIR`` writes
``DIR/squad_article/bin`` and ``DIR/encoder``); without them the QA update is left out. ``--lm-data``: a binarised LM
folder (default: the committed WikiText-2 slice, binarised here into a temporary folder); the LM update is the code
corpus's 4-layer model (``examples/longrange/train.sh``: 128 dims, windows 64 / 32, 1,024 tokens, batch 4).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import markdown_table, stopwatch, timed_repeats
from benchmarks.machine import cpu_model
from fairseq_clusterformer.ops.precision import matmul_gflops

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KINDS = ("window", "cluster-strict", "lsh", "sparse")


def layer_seconds(kind: str, precision: str, attention_dropout: float, args) -> float:
    """One layer's forward + backward at the QA model's sizes (384 channels, 12 heads, FFN 1,536, windows 256 / 224)."""
    from benchmarks.layer_builder import build

    shape = argparse.Namespace(dim=384, heads=12, ffn=1536, window=256, stride=224, clusters=64, groups=8,
                               dropout=0.1, attention_dropout=attention_dropout)  # fmt: skip
    torch.manual_seed(1)
    layer = build(kind, shape).train()
    if precision == "compiled":
        layer.compile_mode = "on"
    x = torch.randn(1, args.tokens, 384, requires_grad=True)  # B x T x C
    pad = torch.zeros(1, args.tokens, dtype=torch.bool)  # B x T

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = layer(x, pad)
        out.float().sum().backward()

    _, cpu = timed_repeats(step, 1 if precision != "compiled" else 2, args.repeats)
    return min(cpu, default=float("inf"))


def layer_linear_flops(tokens: int, window: int = 256, stride: int = 224, dim: int = 384, ffn: int = 1536) -> float:
    """Linear-layer FLOPs of one forward + backward: q, k, v, out (4 C^2) and the FFN (2 C F) per token slot, 2 per
    multiply-add, x3 for the backward; the overlapping windows run every layer over T l / m slots."""
    return tokens * window / stride * (4 * dim * dim + 2 * dim * ffn) * 2 * 3


def trainer_update_seconds(argv: list[str], repeats: int) -> tuple[float, int]:
    """CPU seconds of one fairseq Trainer update (the best of ``repeats`` after 2 warm-up updates) and the token slots
    of its batch, for the fairseq-train command line ``argv``."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.logging import metrics
    from fairseq.trainer import Trainer

    metrics.reset()  # a criterion's derived meters of an earlier update (the QA one) would clash with this one's

    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(1)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    batches = task.get_batch_iterator(
        task.dataset("train"), max_tokens=cfg.dataset.max_tokens, max_sentences=cfg.dataset.batch_size, seed=1
    )
    itr = batches.next_epoch_itr(shuffle=True)
    samples = [next(itr) for _ in range(2 + repeats)]
    for sample in samples[:2]:
        trainer.train_step([sample])
    best = float("inf")
    for sample in samples[2:]:
        with stopwatch() as took:
            trainer.train_step([sample])
        best = min(best, took.cpu)
    slots = sum(int(t.numel()) for t in samples[-1]["net_input"].values() if torch.is_tensor(t))
    return best, slots


def qa_argv(args, precision: str, attention_dropout: float) -> list[str]:
    """The issue's setting: clusterformer_qa_base from the imported encoder, Cluster-Former layers 5, 6, 8 questions,
    article contexts up to 1,024 tokens (examples/qa/cpu_pretrained.sh's other settings)."""
    argv = [str(args.qa_data), "--user-dir", str(REPO / "fairseq_clusterformer"), "--task", "clusterformer_qa",
            "--arch", "clusterformer_qa_base", "--criterion", "clusterformer_qa",
            "--roberta-path", str(args.qa_encoder),
            "--long-range-layer", "cluster", "--long-range-layers", "5,6", "--num-clusters", "64", "--window-size",
            "256", "--window-stride", "224", "--max-question-tokens", "40", "--max-context-train", "1024",
            "--optimizer", "adam", "--lr", "1e-4", "--clip-norm", "1.0", "--batch-size", "8", "--dropout", "0.1",
            "--attention-dropout", str(attention_dropout), "--memory-size", "50000", "--cluster-update-interval", "0",
            "--cpu", "--seed", "1", "--num-workers", "0", "--disable-validation"]  # fmt: skip
    return argv + (["--autocast-bf16"] if precision == "bf16" else [])


def lm_argv(data: Path, precision: str, attention_dropout: float) -> list[str]:
    argv = [str(data), "--user-dir", str(REPO / "fairseq_clusterformer"), "--task", "clusterformer_lm", "--arch",
            "clusterformer_lm_tiny", "--decoder-layers", "4", "--decoder-embed-dim", "128", "--decoder-ffn-embed-dim",
            "512", "--decoder-attention-heads", "4", "--decoder-normalize-before",
            "--share-decoder-input-output-embed", "--window-size", "64", "--window-stride", "32",
            "--long-range-layers", "3,4", "--long-range-layer", "cluster", "--num-clusters", "64",
            "--cluster-update-interval", "0", "--memory-size", "20000", "--tokens-per-sample", "1024",
            "--sample-break-mode", "none", "--batch-size", "4", "--optimizer", "adam", "--lr", "0.002",
            "--dropout", "0.1", "--attention-dropout", str(attention_dropout), "--cpu", "--num-workers", "0",
            "--seed", "1"]  # fmt: skip
    return argv + (["--autocast-bf16"] if precision == "bf16" else [])


def lm_data(given: Path | None, work: Path) -> Path:
    if given is not None:
        return given
    text = REPO / "examples" / "data" / "wikitext-2-slice"
    dest = work / "data-bin"
    command = [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--trainpref", text / "train.txt",
               "--validpref", text / "valid.txt", "--destdir", dest, "--workers", "1"]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    return dest


def measure(args) -> dict:
    result = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tokens": args.tokens}  # fmt: skip
    peak = {"fp32": matmul_gflops(torch.float32, 2048, 3), "bf16": matmul_gflops(torch.bfloat16, 2048, 3)}
    result["matmul_gflops"] = peak
    print(f"| {result['cpu']}, {result['threads']} thread(s): 2048^2 matmul fp32 {peak['fp32']:.0f}, "
          f"bf16 {peak['bf16']:.0f} GFLOP/s", flush=True)  # fmt: skip
    precisions = ["fp32", "bf16"] + (["compiled"] if args.compiled else [])
    rows = result["layers"] = []
    for kind in args.kinds.split(","):
        for drop in (0.1, 0.0):
            for precision in precisions:
                seconds = layer_seconds(kind, precision, drop, args)
                rate = peak["bf16" if precision == "bf16" else "fp32"]
                share = layer_linear_flops(args.tokens) / seconds / 1e9 / rate
                rows.append({"kind": kind, "attention_dropout": drop, "precision": precision, "s": seconds,
                             "peak_share": share})  # fmt: skip
                print(f"| layer {kind} attention dropout {drop}: {precision} {seconds:.3f} s ({share:.0%} of peak)",
                      flush=True)  # fmt: skip
    updates = result["updates"] = []
    with tempfile.TemporaryDirectory() as work:
        cases = [("lm", lm_argv, lm_data(args.lm_data, Path(work)))]
        if args.qa_data is not None:
            cases.insert(0, ("qa", qa_argv, args))
        for name, make, source in cases:
            for drop in (0.1, 0.0):
                for precision in ("fp32", "bf16"):
                    seconds, slots = trainer_update_seconds(make(source, precision, drop), args.repeats)
                    updates.append({"model": name, "attention_dropout": drop, "precision": precision, "s": seconds,
                                    "slots": slots})  # fmt: skip
                    print(f"| {name} update, attention dropout {drop}: {precision} {seconds:.2f} s", flush=True)
    return result


def render(result: dict) -> str:
    peak = result["matmul_gflops"]
    lines = [f"CPU: **{result['cpu']}**, {result['threads']} thread(s), torch {result['torch']}, {result['date']}; "
             f"2,048^2 matrix product: float32 {peak['fp32']:.0f} GFLOP/s, bfloat16 {peak['bf16']:.0f} GFLOP/s "
             f"({peak['bf16'] / peak['fp32']:.1f}x).", ""]  # fmt: skip
    lines.append(f"One layer, forward + backward, T = {result['tokens']:,}, CPU seconds (share of the peak):")
    lines.append("")
    table = []
    for row in result["layers"]:
        if row["precision"] != "fp32":
            continue
        same = [r for r in result["layers"] if r["kind"] == row["kind"]
                and r["attention_dropout"] == row["attention_dropout"]]  # fmt: skip
        cells = {r["precision"]: f"{r['s']:.3f} ({r['peak_share']:.0%})" for r in same}
        ratio = row["s"] / next(r["s"] for r in same if r["precision"] == "bf16")
        table.append([row["kind"], row["attention_dropout"], cells["fp32"], cells["bf16"],
                      cells.get("compiled", "-"), f"{ratio:.2f}x"])  # fmt: skip
    lines.append(markdown_table(["kind", "attention dropout", "float32", "bfloat16", "compiled (float32)",
                                 "bfloat16 gain"], table))  # fmt: skip
    lines += ["", "One training update (fairseq's Trainer), CPU seconds:", ""]
    table = []
    for row in result["updates"]:
        if row["precision"] == "fp32":
            bf16 = next(r for r in result["updates"] if r["model"] == row["model"] and r["precision"] == "bf16"
                        and r["attention_dropout"] == row["attention_dropout"])  # fmt: skip
            table.append([row["model"], row["attention_dropout"], f"{row['s']:.2f}", f"{bf16['s']:.2f}",
                          f"{row['s'] / bf16['s']:.2f}x"])  # fmt: skip
    lines.append(markdown_table(["update", "attention dropout", "float32", "bfloat16", "bfloat16 gain"], table))
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--qa-data", type=Path, help="binarised whole-article SQuAD (cpu_pretrained.sh --prepare-only)")
    p.add_argument("--qa-encoder", type=Path, help="the imported encoder beside it (DIR/encoder)")
    p.add_argument("--lm-data", type=Path, help="a binarised LM folder (default: the committed WikiText-2 slice)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--tokens", type=int, default=4096, help="T of the layer timings")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--compiled", action="store_true", help="also time --compile-layers on (minutes of Inductor builds)")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args()
    if (args.qa_data is None) != (args.qa_encoder is None):
        p.error("--qa-data and --qa-encoder go together")
    for flag, path in (("--qa-data", args.qa_data), ("--qa-encoder", args.qa_encoder), ("--lm-data", args.lm_data)):
        if path is not None and not (path / "dict.txt").is_file():
            p.error(f"{flag} {path}: no dict.txt there")
    result = measure(args)
    text = render(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
