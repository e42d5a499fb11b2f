"""The work one layer's forward+backward does, counted on a CPU: why a layer is slower than FlexAttention's sliding
window once a GPU is no longer launch-bound (T = 32,768; ``docs/gpu_speed.md``, "The 32k gap").

Per kind (built by ``layer_builder.py``, dropout 0, fp32, B = 1): the matrix-product FLOPs
(``torch.utils.flop_counter``; the attention's own products are left out, as SDPA on a CPU is not counted), the
bytes every ATen op writes (eager, so before any fusion: an upper bound of the traffic) and of them the bytes of the
ops that only move data (gathers, their backward scatter-adds, cat, stack, where); the reference is
``gpu_check.reference_attention.BandAttentionLayer`` (a band of ``--window`` tokens, one FFN pass per token). Then
FlexAttention's block lists at each T: the key blocks of 128 the Cluster-Former band touches (``ops.flex_windows``)
against those of ``create_block_mask`` of the reference's band (partial and full).

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.work_per_layer --length 3072 --mask-lengths 4096,32768
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.gpu_check.reference_attention import BandAttentionLayer
from benchmarks.layer_builder import build

KINDS = ("reference", "window", "window:attention", "window-band", "cluster-strict", "cluster-paper")
MOVES = ("gather", "scatter", "index", "cat", "stack", "where")


class BytesWritten(TorchDispatchMode):
    """Bytes of every op's outputs (views write nothing), by op name."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        alias = func._schema.returns[0].alias_info if func._schema.returns else None
        if alias is None or alias.is_write:
            for value in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(value, torch.Tensor):
                    self.bytes[func.overloadpacket.__name__] += value.numel() * value.element_size()
        return out


def count(kind: str, length: int, args) -> dict:
    torch.manual_seed(0)
    if kind == "reference":
        layer = BandAttentionLayer(args.dim, args.heads, args.ffn, args.window, "sdpa-band")
    else:
        layer = build(kind, args)
    x = torch.randn(1, length, args.dim, requires_grad=True)  # B x T x C

    def step():
        out = layer(x) if kind == "reference" else layer(x, None)
        out.sum().backward()

    with FlopCounterMode(display=False) as flops:
        step()
    products = sum(v for k, v in flops.get_flop_counts()["Global"].items() if "attention" not in str(k))
    with BytesWritten() as written:
        step()
    moved = sum(v for k, v in written.bytes.items() if any(m in k for m in MOVES))
    return {"gflop": products / 1e9, "mib": sum(written.bytes.values()) / 2**20, "moved_mib": moved / 2**20}


def block_counts(length: int, window: int) -> dict:
    from torch.nn.attention.flex_attention import create_block_mask

    from fairseq_clusterformer.ops.flex_windows import BLOCK, band_structure

    ours = band_structure(length, window, BLOCK, torch.device("cpu"))[0]
    reference = create_block_mask(
        lambda b, h, q, k: (k <= q) & (q - k < window), None, None, length, length, device="cpu"
    )
    return {
        "query_blocks": ours.numel(),
        "ours_partial": int(ours.sum()),
        "reference_partial": int(reference.kv_num_blocks.sum()),
        "reference_full": int(reference.full_kv_num_blocks.sum()),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=3072)
    p.add_argument("--mask-lengths", default="4096", help="T of the block counts (the reference's mask is T x T)")
    for name, default in (("dim", 512), ("heads", 8), ("ffn", 2048), ("window", 256), ("stride", 128)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--clusters", type=int, default=512)
    p.add_argument("--groups", type=int, default=6)
    args = p.parse_args(argv)
    args.dropout = args.attention_dropout = 0.0
    args.long_range_values = "own"
    print(f"T = {args.length}: kind | matmul GFLOP | MiB written | of it moved (gathers, scatters, cat, stack, where)")
    for kind in KINDS:
        c = count(kind, args.length, args)
        print(f"{kind} | {c['gflop']:.1f} | {c['mib']:.0f} | {c['moved_mib']:.0f}", flush=True)
    for length in map(int, args.mask_lengths.split(",")):
        print(f"T = {length}: FlexAttention key blocks of 128:", block_counts(length, args.window), flush=True)


if __name__ == "__main__":
    main()
