"""Ops per layer: what one forward+backward of each layer kind launches, eager and compiled (``--compile-layers on``).

On a GPU a layer whose every op is small costs what its launches cost (``results/gpu``: our layers' time hardly grows
from 3k to 32k tokens), so the count of launches is the figure that compiling must bring down, and a CPU can count
it:

- eager: every ATen op dispatched during the pass, counted by a ``TorchDispatchMode``; "compute" leaves out the ops
  that only make a view of their input (``view``, ``transpose``, ``expand``, ``unfold``, ...), which launch nothing;
- compiled: the calls in the code Inductor generates for the layer's compiled function, forward and backward
  (``torch._inductor.utils.run_and_get_code``): its fused kernels (``cpp_fused_*`` on a CPU, ``triton_*`` on a GPU),
  the library calls it keeps (``extern_kernels.*``: matrix products) and the ATen ops it falls back to (sorts,
  gathers it does not generate). The count is per compiled graph, so it does not depend on T (both lengths are
  counted to show it); a GPU build fuses a little differently from this CPU one.

Layers are built by ``layer_builder.py`` (``layer_scaling.py``'s flags), dropout 0, batch 1; FlexAttention has no
backward pass on a CPU and is counted on a GPU only (``make gpu-check``'s ``layers`` part times it).

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) OMP_NUM_THREADS=1 nice .venv/bin/python -m benchmarks.ops_per_layer
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import append_jsonl, markdown_table, parse_shape_args, read_jsonl, stopwatch
from benchmarks.layer_builder import build
from benchmarks.machine import machine_info

HERE = Path(__file__).resolve()
KINDS = {"window": ("window", "own"), "cluster-strict": ("cluster-strict", "own")}
KINDS.update({"cluster-paper": ("cluster-paper", "own"), "cluster-strict next values": ("cluster-strict", "next")})
TARGET_COMPILED = 60  # the target: compiled kernels per Cluster-Former layer forward+backward
# a call in Inductor's generated wrapper that runs work: a fused kernel, a library call, an ATen fallback
KERNEL_CALL = re.compile(r"\b(cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|aten\.\w+(?:\.\w+)?)\(")


class OpCounter(TorchDispatchMode):
    """Counts every ATen op dispatched inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        alias = func._schema.returns[0].alias_info if func._schema.returns else None
        if alias is not None and not alias.is_write:  # the output is a view of an input: nothing is launched
            self.views += 1
        return func(*args, **(kwargs or {}))


def layer_and_input(kind: str, length: int, args):
    base, values = KINDS[kind]
    torch.manual_seed(args.seed)
    layer = build(base, argparse.Namespace(**{**vars(args), "long_range_values": values})).train()
    x = torch.randn(1, length, args.dim, requires_grad=True)  # B x T x C
    return layer, x


def count_eager(kind: str, length: int, args) -> dict:
    layer, x = layer_and_input(kind, length, args)
    layer(x, None).sum().backward()  # warm-up: lazy initialisation is not the layer's work
    x.grad = None
    with OpCounter() as counter:
        layer(x, None).sum().backward()
    total = sum(counter.ops.values())
    return {"ops": total, "compute_ops": total - counter.views, "top": counter.ops.most_common(8)}


def kernel_calls(source: str) -> int:
    """Kernel launches in one generated wrapper: the calls inside its ``call`` function."""
    body = source.split("def call(", 1)[-1].split("\ndef ", 1)[0]
    return len(KERNEL_CALL.findall(body))


def count_compiled(kind: str, length: int, args) -> dict:
    from torch._inductor.utils import run_and_get_code

    from fairseq_clusterformer.layers.build import configure_layers

    layer, x = layer_and_input(kind, length, args)
    configure_layers([layer], "on", "eager")
    torch._dynamo.reset()
    with stopwatch() as took:
        _, sources = run_and_get_code(lambda: layer(x, None).sum().backward())
    wrappers = [s for s in sources if "def call(" in s]
    if len(wrappers) != 2:
        raise RuntimeError(f"expected a forward and a backward wrapper, Inductor generated {len(wrappers)}")
    forward, backward = (kernel_calls(s) for s in wrappers)
    return {
        "kernels_forward": forward,
        "kernels_backward": backward,
        "kernels": forward + backward,
        "compile_s": took.wall,
    }


def render(records: list[dict], info: dict, args) -> str:
    lengths = sorted({r["length"] for r in records})
    rows = []
    for kind in KINDS:
        found = {r["length"]: r for r in records if r["kind"] == kind}
        cells = [kind]
        for length in lengths:
            r = found.get(length, {})
            cells.append(f"{r['ops']} ({r['compute_ops']})" if "ops" in r else r.get("error", ""))
        for length in lengths:
            r = found.get(length, {})
            text = f"{r['kernels']} ({r['kernels_forward']} + {r['kernels_backward']})" if "kernels" in r else ""
            cells.append(text or r.get("compiled_error", ""))
        rows.append(cells)
    headers = ["kind", *(f"eager ops, T = {t} (compute)" for t in lengths)]
    headers += [f"compiled kernels, T = {t} (forward + backward)" for t in lengths]
    compile_s = ", ".join(f"{r['kind']} T={r['length']} {r['compile_s']:.0f} s" for r in records if "compile_s" in r)
    cluster = [r["kernels"] for r in records if r["kind"].startswith("cluster-strict") and "kernels" in r]
    verdict = "met" if cluster and max(cluster) <= TARGET_COMPILED else ("NOT met" if cluster else "not measured")
    return (
        f"# Ops per layer forward+backward\n\nMachine: {info['cpu']}, {info['cores']} cores; torch {info['torch']} "
        f"(CPU), Python {info['python']}; {time.strftime('%Y-%m-%d', time.gmtime())}.\n\n"
        f"{__doc__.split(chr(10) + chr(10), 1)[1].split(chr(10) + chr(10) + '    ')[0].strip()}\n\n"
        + f"Layer: dim {args.dim}, {args.heads} heads, FFN {args.ffn}, window {args.window} / stride {args.stride}, "
        f"{args.clusters} clusters, strict mode's {args.groups} groups, batch 1. Command: "
        f"`TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) OMP_NUM_THREADS=1 nice .venv/bin/python "
        f"{records[0]['command'].strip()}`.\n\n"
        + markdown_table(headers, rows)
        + "\n\nSeconds to compile one forward + backward (after ``torch._dynamo.reset()``; the latest run started with "
        "an empty ``TORCHINDUCTOR_CACHE_DIR``, and later cases reuse the kernels earlier ones built; the machine "
        f"shared with other jobs): {compile_s}."
        + f"\n\nTarget: compiled kernels per Cluster-Former (strict) layer forward+backward <= "
        f"{TARGET_COMPILED}: **{verdict}** (largest: {max(cluster) if cluster else 'n/a'}).\n"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, from {list(KINDS)}")
    p.add_argument("--lengths", default="2048,8192", help="T of every count")
    p.add_argument("--no-compile", action="store_true", help="eager counts only (compiling takes minutes a kind)")
    p.add_argument("--out-dir", type=Path, default=HERE.parent / "results")
    p.add_argument("--render-only", action="store_true", help="only write the table from the results file")
    own, rest = p.parse_known_args(argv)
    args = parse_shape_args([*rest, "--dropout", "0", "--attention-dropout", "0"])
    out = own.out_dir / "ops_per_layer.jsonl"
    if out.exists() and not own.render_only:
        out.unlink()
    for kind in [] if own.render_only else own.kinds.split(","):
        for length in (int(t) for t in own.lengths.split(",")):
            record = {"kind": kind, "length": length, **count_eager(kind, length, args)}
            if not own.no_compile:
                try:
                    record.update(count_compiled(kind, length, args))
                except Exception as err:  # one kind failing to compile is a result, not the end of the run
                    record["compiled_error"] = f"{type(err).__name__}: {str(err)[:300]}"
            record["command"] = "benchmarks/ops_per_layer.py " + " ".join(argv if argv is not None else sys.argv[1:])
            print(record, flush=True)
            append_jsonl(out, record)
    info = machine_info()
    text = render(read_jsonl(out), info, args)
    (own.out_dir / "ops_per_layer.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
