"""Which precision a CPU recipe should train and score in on this machine: print ``bf16`` where the CPU multiplies
bfloat16 natively (AVX512-BF16 or AMX: measured about 4x float32's rate on this project's AMD EPYC), else ``fp32``
(torch's own bfloat16 kernels run there from a fifth of float32's rate down to a fiftieth, 1 against 56 GFLOP/s on an
AMD EPYC without AVX-512; ``--autocast-bf16`` runs them through float32 kernels, ``--bf16-products auto``, which makes
bfloat16 as fast as float32 there, not faster, so float32's precision costs nothing). The two measured rates go to
stderr, so that a recipe's log says why it chose what it chose.

    python examples/cpu_precision.py           ->   "bf16"   (stderr: "bfloat16 443 GFLOP/s, float32 103 GFLOP/s")

examples/qa/cpu_pretrained.sh uses it for PRECISION=auto, its default. The rates are those of
``fairseq_clusterformer.ops.precision.matmul_rates`` (512 x 512 products, CPU seconds of this process, so that other
processes' load does not count); the threshold, twice float32's rate, keeps a noisy measurement on a machine without
native bfloat16 (0.2x) or with a slow one from choosing bfloat16.
"""

from __future__ import annotations

import argparse
import sys

NATIVE_SPEED_UP = 2.0


def choose(fp32_gflops: float, bf16_gflops: float) -> str:
    """``bf16`` where bfloat16 products run at least ``NATIVE_SPEED_UP`` times float32's rate, else ``fp32``."""
    return "bf16" if bf16_gflops >= NATIVE_SPEED_UP * fp32_gflops else "fp32"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    from fairseq_clusterformer.ops.precision import matmul_rates  # torch only after --help

    fp32, bf16 = matmul_rates(device="cpu")
    choice = choose(fp32, bf16)
    print(
        f"cpu_precision.py: bfloat16 {bf16:.0f} GFLOP/s, float32 {fp32:.0f} GFLOP/s on this CPU: {choice}",
        file=sys.stderr,
    )
    print(choice)
    return 0


if __name__ == "__main__":
    sys.exit(main())
