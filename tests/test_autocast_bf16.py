"""--autocast-bf16 of the QA task: the training forward pass runs its matrix products in bfloat16 under
torch.autocast, the loss and the gradients stay float32, and it refuses fairseq's own half-precision optimizers.
Device-independent (`--device cuda` runs it on a GPU)."""

import pytest
import torch
from fairseq.optim.amp_optimizer import AMPOptimizer

from fairseq_clusterformer.layers.kinds import KINDS, NO_LONG_RANGE
from fairseq_clusterformer.qa.criterion import ClusterFormerQACriterion
from tests.conftest import PACKAGE, TINY_LM_TRAIN, run_cli
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_model import batch, build


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


class PlainOptimizer:
    """What fairseq's FairseqOptimizer.backward does without a loss scaler."""

    def backward(self, loss):
        loss.backward()


def train_step(task, model, sample, autocast: bool):
    """(loss, dtypes of the span head's input and output, gradient of the span head) of one training step."""
    task.cfg.autocast_bf16 = autocast
    criterion = ClusterFormerQACriterion(task)
    seen = []
    hook = model.qa_heads.span.register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o.dtype)))
    model.zero_grad()
    try:
        loss, sample_size, log = task.train_step(sample, model, criterion, PlainOptimizer(), update_num=0)
    finally:
        hook.remove()
    return loss, seen, model.qa_heads.span.weight.grad.clone()


def to_device(sample, device):
    return {k: to_device(v, device) if isinstance(v, dict) else v.to(device) if torch.is_tensor(v) else v
            for k, v in sample.items()}  # fmt: skip


@pytest.mark.parametrize("kind", [NO_LONG_RANGE, *KINDS])
def test_autocast_bf16_runs_the_forward_pass_in_bfloat16_with_float32_loss_and_gradients(qa_data, device, kind):
    task, model = build(qa_data, "--long-range-layer", kind)
    model.to(device)
    sample = to_device(batch(task, "train", [0, 1, 2, 3]), device)
    loss32, seen32, grad32 = train_step(task, model, sample, autocast=False)
    loss16, seen16, grad16 = train_step(task, model, sample, autocast=True)
    assert seen32 == [(torch.float32, torch.float32)]
    assert seen16[0][1] == torch.bfloat16  # the head's matrix product ran in bfloat16
    assert loss16.dtype == torch.float32 and grad16.dtype == torch.float32 and torch.isfinite(grad16).all()
    # the same function to bfloat16's precision (8 bits of mantissa), and not the float32 pass itself
    assert abs(float(loss16) - float(loss32)) <= 0.02 * abs(float(loss32))
    assert float(loss16) != float(loss32)
    cos = torch.nn.functional.cosine_similarity(grad16.flatten(), grad32.flatten(), dim=0)
    assert cos > 0.99
    assert model.training  # train_step leaves the model in training mode, as fairseq's does


def test_autocast_bf16_refuses_fairseqs_half_precision_optimizers(qa_data):
    task, model = build(qa_data, "--long-range-layer", "none")
    task.cfg.autocast_bf16 = True
    criterion = ClusterFormerQACriterion(task)
    amp = AMPOptimizer.__new__(AMPOptimizer)  # what fairseq builds for --amp; its state plays no part in the check
    with pytest.raises(ValueError, match="--autocast-bf16 .* --amp"):
        task.train_step(batch(task, "train", [0]), model, criterion, amp, update_num=0)


def last_line(out: str) -> str:
    return out.strip().splitlines()[-1]


@pytest.mark.e2e
@pytest.mark.parametrize("half, named", [("--fp16", "--fp16"), ("--bf16", "--bf16"),
                                         ("--memory-efficient-bf16", "--memory-efficient-bf16")])  # fmt: skip
def test_autocast_bf16_with_fairseqs_half_precision_is_refused_at_set_up_naming_both(lm_data, tmp_path, half, named):
    code, out = run_cli("fairseq-train", lm_data, *TINY_LM_TRAIN, "--max-update", "1", "--save-dir", tmp_path,
                        "--autocast-bf16", half)  # fmt: skip
    assert code != 0 and "--autocast-bf16 with " in last_line(out) and named in last_line(out), out[-2000:]
    assert "give one or the other" in last_line(out) and "CUDA" not in out and "xla" not in out
    code, out = run_cli("fairseq-eval-lm", lm_data, "--user-dir", PACKAGE, "--task", "clusterformer_lm",
                        "--path", tmp_path / "none.pt", "--autocast-bf16", half)  # fmt: skip
    assert code != 0 and "--autocast-bf16 with " in last_line(out) and named in last_line(out), out[-2000:]


@pytest.mark.e2e
def test_autocast_bf16_outside_its_tasks_names_them(lm_data, tmp_path):
    code, out = run_cli("fairseq-train", lm_data, "--user-dir", PACKAGE, "--arch", "clusterformer_lm_tiny",
                        "--autocast-bf16", "--save-dir", tmp_path)  # fmt: skip
    assert code != 0 and "unrecognized arguments: --autocast-bf16" in out
    said = "fairseq-train: --autocast-bf16 is a flag of --task clusterformer_lm and --task clusterformer_qa; this "
    assert said + "command line gives no --task (fairseq's default task)" in out, out[-2000:]
