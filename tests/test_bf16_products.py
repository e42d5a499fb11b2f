"""bfloat16 products through float32 kernels (ops/bf16_products.py, --bf16-products): the same rounding points as
torch's bfloat16 kernels, the choice of when they apply, and a fairseq training step that takes them."""

from __future__ import annotations

import argparse

import pytest
import torch
import torch.nn.functional as F

from fairseq_clusterformer.ops import precision
from fairseq_clusterformer.ops.bf16_products import ATTENTION_FORWARD, Bfloat16ProductsInFloat32


def bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.mark.parametrize(
    "product",
    [
        lambda a, b, c: torch.mm(a[0], b[0]),
        lambda a, b, c: torch.addmm(c[0, 0], a[0], b[0]),
        lambda a, b, c: torch.bmm(a, b),
        lambda a, b, c: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0),
    ],
    ids=["mm", "addmm", "bmm", "baddbmm"],
)
def test_a_product_is_the_float32_product_of_the_same_values_rounded_once(product):
    a, b, c = bf16(3, 64, 200, seed=1), bf16(3, 200, 48, seed=2), bf16(3, 64, 48, seed=3)
    with Bfloat16ProductsInFloat32():
        got = product(a, b, c)
    wide = product(a.float(), b.float(), c.float())
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, wide.bfloat16())  # bfloat16 values widen exactly: one rounding, at the end
    # (no comparison with torch's own kernel here: on a CPU without native bfloat16 torch 2.0's fallback rounds its
    # partial sums, several bfloat16 steps from a float32 sum; the layer test below compares with it)


@pytest.mark.skipif(ATTENTION_FORWARD is None, reason="this torch has no CPU flash attention (before 2.2)")
def test_attention_takes_float32_kernels_and_returns_bfloat16_as_torchs_does():
    """Forward and backward are torch's float32 flash kernels on the widened inputs; the backward reads the
    forward's output as torch's bfloat16 kernel does: rounded to bfloat16."""
    aten = torch.ops.aten
    q, k, v = (bf16(2, 4, 256, 32, seed=s).requires_grad_() for s in (4, 5, 6))
    grad = bf16(2, 4, 256, 32, seed=7)
    with Bfloat16ProductsInFloat32():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)
    wide = [t.detach().float() for t in (q, k, v)]
    expected, logsumexp = aten._scaled_dot_product_flash_attention_for_cpu(*wide, 0.0, True)
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad.float(), *wide, expected.bfloat16().float(), logsumexp, 0.0, True
    )
    assert out.dtype == torch.bfloat16 and q.grad.dtype == torch.bfloat16
    assert torch.equal(out, expected.bfloat16())
    for got, want in zip((q.grad, k.grad, v.grad), grads):
        assert torch.equal(got, want.bfloat16())
    native = F.scaled_dot_product_attention(*(t.detach() for t in (q, k, v)), is_causal=True)
    assert float((out.float() - native.float()).norm() / native.float().norm()) < 2e-3


def test_other_operations_and_other_dtypes_run_as_without_the_mode():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with Bfloat16ProductsInFloat32():
        assert torch.equal(a @ b, torch.mm(a, b))  # float32 stays float32's kernel
        assert torch.mm(a.double(), b.double()).dtype == torch.float64
        with pytest.raises(RuntimeError):  # mixed dtypes keep torch's own error, not a silent widening
            torch.mm(a.bfloat16(), b)
        assert torch.equal(torch.relu(a.bfloat16()), torch.relu(a.bfloat16()))


def test_a_layer_under_the_mode_is_as_far_from_float32_as_torchs_bfloat16_kernels_are():
    """The QA layer's forward and backward: the mode's result differs from torch's bfloat16 kernels by less than
    bfloat16 differs from float32, and is as far from float32 as they are: bfloat16's numerics, not float32's."""
    from benchmarks.layer_builder import build

    shape = argparse.Namespace(dim=64, heads=4, ffn=128, window=64, stride=48, clusters=8, groups=4, dropout=0.0,
                               attention_dropout=0.0)  # fmt: skip
    torch.manual_seed(1)
    layer = build("window", shape).train()
    x0 = torch.randn(1, 256, 64)  # B x T x C
    pad = torch.zeros(1, 256, dtype=torch.bool)  # B x T

    def run(autocast: bool, mode: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x = x0.clone().requires_grad_()
        with Bfloat16ProductsInFloat32() if mode else torch.autocast("cpu", enabled=False):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = layer(x, pad)
            out.float().pow(2).sum().backward()
        return out.detach().float(), x.grad

    fp32, native, emulated = run(False, False), run(True, False), run(True, True)

    def distance(a, b):
        return float((a - b).norm() / b.norm())

    for i in (0, 1):  # the output, then the input's gradient
        assert distance(emulated[i], native[i]) < distance(native[i], fp32[i])
        assert 0.5 < distance(emulated[i], fp32[i]) / distance(native[i], fp32[i]) < 2.0


@pytest.fixture
def products_choice():
    before = precision._products["choice"]
    yield
    precision.set_bf16_products(before)


def test_auto_takes_float32_kernels_only_where_the_cpu_multiplies_bfloat16_slower(monkeypatch, products_choice):
    for rates, expected in (((95.0, 1.0), True), ((160.0, 1100.0), False)):
        monkeypatch.setattr(precision, "_rates_seen", {"cpu": rates})
        precision.set_bf16_products("auto")
        assert precision.products_through_float32("cpu") is expected
        precision.set_bf16_products("native")
        assert precision.products_through_float32("cpu") is False
        precision.set_bf16_products("float32")
        assert precision.products_through_float32("cpu") is True
        assert precision.products_through_float32("cuda") is False  # a GPU multiplies bfloat16 itself
    with pytest.raises(ValueError, match="--bf16-products fast: expected one of auto, native, float32"):
        precision.set_bf16_products("fast")


def test_bf16_layers_enter_the_mode_once_and_leave_it(products_choice):
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    precision.set_bf16_products("float32")
    x = torch.zeros(1)

    def modes():
        return [m for m in _get_current_dispatch_mode_stack() if isinstance(m, Bfloat16ProductsInFloat32)]

    with precision.bf16_products("cpu"):
        with precision.bf16_layers(x, True):
            assert len(modes()) == 1
    assert not modes()
    precision.set_bf16_products("native")
    with precision.bf16_layers(x, True):
        assert not modes()


def test_a_qa_training_step_takes_float32_kernels_in_its_forward_and_backward(
    monkeypatch, products_choice, tmp_path_factory
):
    """--autocast-bf16's train_step with --bf16-products float32: its products (forward and backward: more than twice
    the forward's) go through the mode, and the step's loss and gradient are native bfloat16's to its precision."""
    from tests.data.qa_model.synthetic import shared_data
    from tests.test_autocast_bf16 import train_step
    from tests.test_qa_model import batch, build

    task, model = build(shared_data(tmp_path_factory), "--long-range-layer", "cluster")
    sample = batch(task, "train", [0, 1, 2, 3])
    widened = []
    dispatch = Bfloat16ProductsInFloat32.__torch_dispatch__

    def counting(self, func, types, args=(), kwargs=None):
        widened.append(func)
        return dispatch(self, func, types, args, kwargs)

    precision.set_bf16_products("native")
    loss_native, _, grad_native = train_step(task, model, sample, autocast=True)
    assert not widened
    monkeypatch.setattr(Bfloat16ProductsInFloat32, "__torch_dispatch__", counting)
    precision.set_bf16_products("float32")
    loss, _, grad = train_step(task, model, sample, autocast=True)
    step = sum(func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) for func in widened)
    widened.clear()
    from fairseq_clusterformer.qa.criterion import ClusterFormerQACriterion

    with precision.bf16_products("cpu"), torch.autocast("cpu", dtype=torch.bfloat16):
        ClusterFormerQACriterion(task)(model, sample)
    forward = sum(func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) for func in widened)
    assert forward > 0 and step >= 2 * forward, (forward, step)
    assert abs(float(loss) - float(loss_native)) <= 0.01 * abs(float(loss_native))
    assert torch.nn.functional.cosine_similarity(grad.flatten(), grad_native.flatten(), dim=0) > 0.99
