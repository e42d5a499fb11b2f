"""Generated tokens/s of fairseq's sequence generator: the cached Cluster-Former decoder, the same decoder recomputing
the whole prefix every step, and fairseq's transformer_lm with its own key/value cache.

L = prompt + continuation length, C = model dim, l = window size.

Every model has the same shape (``--layers`` layers of ``--dim``, sinusoidal positions, byte vocabulary of Tiny
Shakespeare, random weights: speed does not depend on what was learnt). A case generates greedily (beam 1, batch 1)
from a ``--prompt``-token prompt to exactly L tokens (``min_len`` = ``max_len``), timing ``task.inference_step``:
the prompt is forced token by token, so every one of the L steps runs the decoder. Rates are L / time.

Full recomputation costs O(L) per step, so a whole run at L = 8,192 would take hours: the ``uncached`` column times
only the last ``--tail-steps`` decoder calls of a run (the prefix of L - k .. L - 1 tokens, without a cache, as the
generator would call it), which is the slowest part of such a run; its whole-run average would be about twice that
rate (the cost grows linearly from 0).

    OMP_NUM_THREADS=1 nice .venv/bin/python -m benchmarks.bench_generation
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch

from benchmarks.common import append_jsonl, markdown_table, prepare_char_data, stopwatch
from benchmarks.machine import LoadSampler, machine_info, machine_markdown

HERE = Path(__file__).resolve()
PACKAGE = HERE.parent.parent / "fairseq_clusterformer"
RESULTS = HERE.parent / "results"


def model_args(model: str, args) -> list[str]:
    """The fairseq-train arguments of one model (its shape; only the model is built from them)."""
    longest = max(args.lengths)
    common = (
        f"{args.data} --user-dir {PACKAGE} --tokens-per-sample {longest} --max-target-positions {longest} "
        f"--decoder-layers {args.layers} --decoder-embed-dim {args.dim} --decoder-ffn-embed-dim {4 * args.dim} "
        f"--decoder-attention-heads {args.heads} --decoder-input-dim {args.dim} --decoder-output-dim {args.dim} "
        "--decoder-normalize-before --share-decoder-input-output-embed --dropout 0"
    ).split()
    if model == "transformer_lm":
        return common + "--task language_modeling --arch transformer_lm".split()
    return (
        common
        + (
            f"--task clusterformer_lm --arch clusterformer_lm_enwik8 --long-range-layer {model} "
            f"--long-range-layers {args.long_range_layers} --num-clusters {args.clusters} "
            f"--window-size {args.window} --window-stride {args.window // 2} --memory-size 1000"
        ).split()
    )


def build(model: str, args):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, input_args=model_args(model, args)))
    torch.manual_seed(1)
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model).eval()


def generate(task, model, length: int, prompt: int, device: str = "cpu") -> float:
    """Wall seconds of one greedy generation to ``length`` tokens (the leading end-of-sentence included), with the
    prompt on ``device`` (the model's; benchmarks/gpu_check passes cuda)."""
    from fairseq.sequence_generator import SequenceGenerator

    steps = length - 1  # the generator's first input is the end-of-sentence token it starts from
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=1, max_len_b=steps, min_len=steps)
    tokens = torch.randint(4, len(task.target_dictionary), (1, prompt))
    tokens[0, 0] = task.target_dictionary.eos()
    sample = {"net_input": {"src_tokens": tokens.to(device), "src_lengths": torch.tensor([prompt], device=device)}}
    # on a GPU the clock stops when the GPU has finished, not when the last kernel was queued; the wait before it
    # starts finds the GPU idle (the prompt's copy to it above has already waited for itself)
    with stopwatch(device) as took, torch.no_grad():
        hypos = task.inference_step(generator, [model], sample)
    assert hypos[0][0]["tokens"].numel() == steps + 1, "the generator stopped early"  # + the final end-of-sentence
    return took.wall


def uncached_tail(task, model, length: int, steps: int) -> float:
    """Wall seconds per step of the last ``steps`` decoder calls of an uncached run to ``length`` tokens."""
    model.decoder.use_cache = False
    tokens = torch.randint(4, len(task.target_dictionary), (1, length))
    with torch.no_grad():
        model.decoder(tokens[:, : length - steps], incremental_state={})  # warm-up at the same size
        with stopwatch() as took:
            for end in range(length - steps + 1, length + 1):  # the prefixes the generator's last steps pass
                model.decoder(tokens[:, :end], incremental_state={})
    model.decoder.use_cache = True
    return took.wall / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="512,2048,8192")
    p.add_argument("--models", default="cluster,transformer_lm")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--clusters", type=int, default=64)
    p.add_argument("--long-range-layers", default="2,4")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--tail-steps", type=int, default=3)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/clusterformer-bench"))
    p.add_argument("--out", type=Path, default=RESULTS / "generation.md")
    args = p.parse_args()
    args.lengths = [int(n) for n in args.lengths.split(",")]
    args.work_dir.mkdir(parents=True, exist_ok=True)
    args.data = prepare_char_data(args.work_dir)
    logging.disable(logging.WARNING)
    records = []
    with LoadSampler() as load:
        for name in args.models.split(","):
            task, model = build(name, args)
            generate(task, model, 64, args.prompt)  # warm-up
            for length in args.lengths:
                with stopwatch() as whole:  # CPU time of the whole call (building the generator too), wall: generate's
                    wall = generate(task, model, length, args.prompt)
                record = {"model": name, "length": length, "wall_s": wall, "cpu_s": whole.cpu}
                if name != "transformer_lm":
                    record["uncached_s_per_token"] = uncached_tail(task, model, length, args.tail_steps)
                records.append(record)
                settings = {k: str(v) for k, v in vars(args).items()}
                append_jsonl(RESULTS / "generation.jsonl", {**record, "settings": settings, **machine_info()})
                print(record, flush=True)
    text = report(records, args, load.summary())
    args.out.write_text(text + "\n")
    print(text)


def report(records: list[dict], args, load: dict) -> str:
    """The markdown page: how it was run, on what, the table, and how to read it."""
    rows = []
    base = {r["length"]: r for r in records if r["model"] == "transformer_lm"}
    for r in records:
        first = next(x for x in records if x["model"] == r["model"])
        rate, cpu_rate = r["length"] / r["wall_s"], r["length"] / r["cpu_s"]
        other = base.get(r["length"]) if r["model"] != "transformer_lm" else None
        tail = r.get("uncached_s_per_token")
        rows.append(
            [
                r["model"] + (" (fairseq KV cache)" if r["model"] == "transformer_lm" else " (cached)"),
                r["length"],
                f"{rate:.0f}",
                f"{cpu_rate:.0f}",
                f"{rate / (first['length'] / first['wall_s']):.2f}",
                f"{other['wall_s'] / r['wall_s']:.2f} / {other['cpu_s'] / r['cpu_s']:.2f}" if other else "",
                f"{1 / tail:.2f}" if tail else "",
                f"{tail * rate:.0f}x" if tail else "",
            ]
        )
    headers = [
        "model",
        "L",
        "tokens/s (wall)",
        "tokens/s (CPU)",
        f"wall rate / rate at L = {args.lengths[0]}",
        "speed vs transformer_lm (wall / CPU)",
        f"uncached tokens/s (last {args.tail_steps} steps, wall)",
        "cached vs uncached (last steps)",
    ]
    command = (
        "OMP_NUM_THREADS=1 nice .venv/bin/python -m benchmarks.bench_generation "
        f"--lengths {','.join(map(str, args.lengths))} --models {args.models}"
    )
    return "\n\n".join(
        [
            "# Generation speed",
            f"Written by `benchmarks/bench_generation.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}:",
            f"    {command}",
            machine_markdown(machine_info(), load),
            f"Shape: {args.layers} layers, dim {args.dim}, FFN {4 * args.dim}, {args.heads} heads, sinusoidal "
            f"positions, byte vocabulary; Cluster-Former: window {args.window} / stride {args.window // 2}, "
            f"long-range layers {args.long_range_layers} (strict causality, {args.clusters} clusters, "
            f"`--window-merge layer`). Greedy, batch 1, a {args.prompt}-token prompt forced step by step, L tokens in "
            "all; random weights. Rates are L / time of `task.inference_step` (fairseq's `SequenceGenerator`).",
            markdown_table(headers, rows),
            "How to read it: the cached decoder's cost per token does not depend on L (each layer attends to at most "
            "a window's worth of cached keys), while `transformer_lm`'s grows with L (its cache, which the generator "
            "copies at every step, and its attention hold every earlier token). The uncached column times only the "
            "last decoder calls of a run, a full forward of up to L tokens each (a whole run at 8,192 would take "
            "hours); its whole-run average would be about twice as fast, since the cost per call grows linearly from "
            "0. Wall-clock rates on this shared machine include time given to other jobs; the CPU-time rates are the "
            "compute.",
        ]
    )


if __name__ == "__main__":
    main()
