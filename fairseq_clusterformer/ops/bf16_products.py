"""bfloat16 products through float32 kernels, for CPUs that do not multiply bfloat16 natively.

Under ``torch.autocast(bfloat16)`` a matrix product reads bfloat16 inputs, accumulates in float32 and rounds its
result to bfloat16. A CPU with AVX512-BF16 or AMX does that in hardware; on one without (AVX2 only), torch falls back
to kernels 10-100 times slower than float32's, and attention's backward pass (its flash kernel) about 7 times slower.
``Bfloat16ProductsInFloat32`` computes the same rounding points with float32 kernels: every bfloat16 input is widened
(exactly: a bfloat16 value is a float32 value), the product runs in float32, and each result that the native kernel
returns in bfloat16 is rounded to bfloat16. Autocast's choice of what runs in bfloat16 and everything between the
products are untouched, so a run keeps bfloat16's numerics at float32's speed.

What differs from a native kernel:
- matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``): only the order of the float32 accumulation, as between
  any two machines' native kernels (AMX and AVX512-BF16 differ too);
- attention (the CPU flash kernel, forward and backward): the native kernel also rounds the unnormalised attention
  weights to bfloat16 before multiplying them with the values; here they stay float32, and about 30 % of the outputs
  differ by one bfloat16 step. Its inputs, output and gradients are rounded as the native kernel's are, and both are
  as far from float32 attention (docs/cpu_speed.md has the figures; ``tests/test_bf16_products.py`` the properties).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# the products whose results torch returns in the inputs' dtype (one tensor)
PRODUCTS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})


def _operator(name: str):
    """``aten.<name>.default``, or None where this torch lacks it."""
    packet = getattr(aten, name, None)
    return None if packet is None else packet.default


# attention on the CPU: the forward returns (output, logsumexp), the output in the inputs' dtype and the logsumexp in
# float32; the backward returns the gradients of query, key and value, all in the inputs' dtype. torch < 2.2 has no
# CPU flash kernel: its attention is made of the products above, which the mode takes anyway
ATTENTION_FORWARD = _operator("_scaled_dot_product_flash_attention_for_cpu")
ATTENTION_BACKWARD = _operator("_scaled_dot_product_flash_attention_for_cpu_backward")
ATTENTION = frozenset(op for op in (ATTENTION_FORWARD, ATTENTION_BACKWARD) if op is not None)


def _is_cpu_bf16(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 and value.device.type == "cpu"


def _widen(value):
    return value.float() if _is_cpu_bf16(value) else value


class Bfloat16ProductsInFloat32(TorchDispatchMode):
    """Inside this mode, CPU matrix products and attention on bfloat16 tensors run in float32 on the same values and
    return bfloat16 results rounded from float32 accumulations; every other operation runs as it would without it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in PRODUCTS and func not in ATTENTION:
            return func(*args, **kwargs)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        query = args[0] if func is ATTENTION_FORWARD else args[1] if func is ATTENTION_BACKWARD else None
        # products: every input bfloat16 (mixed dtypes keep torch's own error); attention: a bfloat16 query (its
        # backward also reads the float32 logsumexp)
        if not (_is_cpu_bf16(query) if query is not None else all(_is_cpu_bf16(t) for t in tensors)):
            return func(*args, **kwargs)
        wide_args = [_widen(a) for a in args]
        wide_kwargs = {name: _widen(value) for name, value in kwargs.items()}
        out = func(*wide_args, **wide_kwargs)
        if func in PRODUCTS:
            return out.to(torch.bfloat16)
        if func is ATTENTION_FORWARD:
            output, logsumexp = out
            return output.to(torch.bfloat16), logsumexp
        return tuple(None if grad is None else grad.to(torch.bfloat16) for grad in out)  # d query, d key, d value
