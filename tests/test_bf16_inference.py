"""--autocast-bf16 beyond the QA training step: the LM task trains under it, fairseq-eval-lm and the QA scripts score
under it (layers in bfloat16, heads and output projections in float32) close to float32, the half-precision
optimizers are refused for the LM as for QA, and a device that multiplies bfloat16 slower than float32 is told so,
with both measured rates."""

import json
import logging
import re

import pytest
import torch
from fairseq import checkpoint_utils, options, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks import setup_task
from torch import nn

from fairseq_clusterformer.compat import autocast_bf16
from fairseq_clusterformer.qa.model import ClusterFormerQAModel
from fairseq_clusterformer.scripts.model_loading import load_model
from tests.conftest import PACKAGE, TINY_LM_TRAIN, run_cli, run_ok
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_end_to_end import TRAIN as QA_TRAIN

pytestmark = pytest.mark.e2e


def loss_base2(output: str) -> float:
    match = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity", output)
    assert match, output[-2000:]
    return float(match.group(1))


@pytest.fixture(scope="module")
def lm_trained(lm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("bf16_lm")
    out = run_ok(
        "fairseq-train", lm_data, *TINY_LM_TRAIN, "--autocast-bf16", "--save-dir", save, "--max-update", "30",
        "--cluster-update-interval", "10", "--memory-size", "3000", "--kmeans-iters", "5", "--no-epoch-checkpoints",
        "--log-format", "simple", "--log-interval", "10", "--seed", "2",
    )  # fmt: skip
    return save, out


def eval_lm(lm_data, checkpoint, *extra):
    return run_ok(
        "fairseq-eval-lm", lm_data, "--user-dir", PACKAGE, "--path", checkpoint, "--gen-subset", "valid",
        "--tokens-per-sample", "200", "--context-window", "100", "--batch-size", "4", "--num-workers", "0", *extra,
    )  # fmt: skip


def test_the_lm_task_trains_under_autocast_bf16_and_refreshes_its_centroids(lm_trained):
    _, out = lm_trained
    assert "--autocast-bf16: training forward passes under torch.autocast('cpu', bfloat16)" in out, out[-3000:]
    assert "kmeans_refreshes=2" in out, out[-3000:]
    losses = [float(x) for x in re.findall(r"train_inner .* loss=([\d.]+)", out)]
    assert len(losses) >= 2 and losses[-1] < losses[0], out[-3000:]


def test_eval_lm_under_autocast_bf16_is_within_half_a_percent_of_float32(lm_trained, lm_data):
    save, _ = lm_trained
    fp32 = eval_lm(lm_data, save / "checkpoint_last.pt")
    bf16 = eval_lm(lm_data, save / "checkpoint_last.pt", "--task", "clusterformer_lm", "--autocast-bf16")
    # the flag reports the two measured rates: as information where bfloat16 is the faster, as a warning on a CPU
    # without native bfloat16 (both kinds of machine run this suite)
    rates = re.search(r"--autocast-bf16: .*bfloat16.* (\d+) GFLOP/s.* (\d+) GFLOP/s", bf16)
    assert rates, bf16[-3000:]
    assert "--autocast-bf16" not in fp32.split("Namespace")[0]
    assert abs(loss_base2(bf16) - loss_base2(fp32)) / loss_base2(fp32) < 0.005, (loss_base2(fp32), loss_base2(bf16))


def test_eval_lms_model_runs_its_layers_in_bfloat16_and_its_output_projection_in_float32(lm_trained, lm_data):
    """What fairseq-eval-lm does to load: the command line's task builds the checkpoint's model."""
    save, _ = lm_trained
    argv = [str(lm_data), "--user-dir", str(PACKAGE), "--path", str(save / "checkpoint_last.pt"),
            "--task", "clusterformer_lm", "--tokens-per-sample", "200"]  # fmt: skip
    outputs = {}
    for flag in ([], ["--autocast-bf16"]):
        # a parser parses once: fairseq adds the task's and model's flags to it while parsing
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_eval_lm_parser(), argv + flag))
        utils.import_user_module(cfg.common)
        models, _, _ = checkpoint_utils.load_model_ensemble_and_task([cfg.common_eval.path], task=setup_task(cfg.task))
        model, seen = models[0].eval(), {}
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                # a hook that returns something replaces the output: record, return None
                module.register_forward_hook(
                    lambda m, i, o, name=name: None if name in seen else seen.update({name: o.dtype})
                )
        with torch.no_grad():
            outputs[bool(flag)] = model(torch.arange(4, 204).reshape(1, 200))[0]
        layers = {dtype for name, dtype in seen.items() if ".layers." in name}
        assert layers == ({torch.bfloat16} if flag else {torch.float32}), seen
        assert seen["decoder.output_projection"] == torch.float32
    assert outputs[True].dtype == torch.float32
    assert 0 < (outputs[True] - outputs[False]).abs().max() < 0.05 * outputs[False].abs().max()


@pytest.mark.parametrize("half", ["--memory-efficient-fp16", "--amp"])
def test_the_lm_task_refuses_autocast_bf16_with_fairseqs_half_precision(lm_data, tmp_path, half):
    code, out = run_cli(
        "fairseq-train", lm_data, *TINY_LM_TRAIN, "--autocast-bf16", half, "--save-dir", tmp_path / "ckpt",
        "--max-update", "2", "--cluster-update-interval", "0",
    )  # fmt: skip
    assert code != 0
    assert f"--autocast-bf16 with {half}: give one or the other" in out, out[-3000:]  # at set-up, before a step


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


@pytest.fixture(scope="module")
def qa_checkpoint(qa_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("bf16_qa")
    run_ok("fairseq-train", qa_data, *QA_TRAIN, "--max-update", "60", "--save-dir", save, "--autocast-bf16")
    return save / "checkpoint_last.pt"


def linear_dtypes(model, sample):
    """The output dtype of each linear layer of ``model`` on ``sample``, and the model's output."""
    seen = {}
    hooks = [
        # a hook that returns something replaces the output: record, return None
        module.register_forward_hook(lambda m, i, o, name=name: None if name in seen else seen.update({name: o.dtype}))
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]
    try:
        with torch.no_grad():
            logits = model(**sample["net_input"])
    finally:
        for hook in hooks:
            hook.remove()
    layers = {dtype for name, dtype in seen.items() if ".layers." in name}
    heads = {dtype for name, dtype in seen.items() if name.startswith("qa_heads")}
    return layers, heads, logits


def test_a_qa_model_loaded_with_bf16_runs_its_layers_in_bfloat16_and_its_heads_in_float32(qa_checkpoint, qa_data):
    overrides = {"data": str(qa_data), "roberta_path": None}
    model32, _, task = load_model(qa_checkpoint, overrides, ClusterFormerQAModel, "a QA checkpoint", cpu=True)
    model16, _, _ = load_model(qa_checkpoint, overrides, ClusterFormerQAModel, "a QA checkpoint", True, bf16=True)
    task.load_dataset("valid")
    sample = task.dataset("valid").collater([task.dataset("valid")[i] for i in range(4)])
    layers32, heads32, logits32 = linear_dtypes(model32, sample)
    layers16, heads16, logits16 = linear_dtypes(model16, sample)
    # trained under --autocast-bf16, the checkpoint still scores in float32 unless asked
    assert layers32 == heads32 == {torch.float32}
    assert layers16 == {torch.bfloat16} and heads16 == {torch.float32}
    for a, b in zip(logits32, logits16):
        if torch.is_tensor(a) and a.is_floating_point():
            finite = torch.isfinite(a) & torch.isfinite(b)
            assert torch.equal(finite, torch.isfinite(a))
            assert (a[finite] - b[finite]).abs().max() < 0.1 * a[finite].abs().max()
            assert not torch.equal(a, b)


@pytest.mark.parametrize("tool", ["fairseq-clusterformer-qa-predict", "fairseq-clusterformer-qa-reach"])
def test_the_qa_scripts_take_autocast_bf16(qa_checkpoint, qa_data, tmp_path, tool):
    if tool.endswith("predict"):
        outputs = [tmp_path / "fp32.json", tmp_path / "bf16.json"]
        args = [["--output", outputs[0]], ["--output", outputs[1], "--autocast-bf16"]]
    else:
        outputs = [tmp_path / "fp32.json", tmp_path / "bf16.json"]
        args = [["--json", outputs[0]], ["--json", outputs[1], "--autocast-bf16"]]
    for extra in args:
        run_ok(tool, qa_data, "--path", qa_checkpoint, "--split", "valid", "--cpu", *extra)
    fp32, bf16 = (json.loads(p.read_text()) for p in outputs)
    if tool.endswith("predict"):
        assert fp32.keys() == bf16.keys()
        same = sum(fp32[k] == bf16[k] for k in fp32)
        assert same >= 0.8 * len(fp32), f"bf16 answered {len(fp32) - same} of {len(fp32)} questions otherwise"
    else:
        assert type(fp32) is type(bf16) and fp32 != bf16


@pytest.fixture
def rates(monkeypatch):
    """Set the rates this process measured (precision.measured_rates) and forget what was said of them."""
    from fairseq_clusterformer.ops import precision

    before = precision._products["choice"]
    monkeypatch.setattr(autocast_bf16, "_SAID", set())

    def set_rates(fp32: float, bf16: float, choice: str = "auto") -> None:
        monkeypatch.setattr(precision, "_rates_seen", {"cpu": (fp32, bf16)})
        precision.set_bf16_products(choice)

    yield set_rates
    precision.set_bf16_products(before)


def test_a_device_slower_in_bfloat16_is_told_so_naming_both_rates(rates, caplog):
    rates(96.0, 21.0, "native")
    with caplog.at_level(logging.INFO):
        assert autocast_bf16.warn_if_bf16_is_slow("cpu") == (96.0, 21.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "bfloat16 at 21 GFLOP/s and float32 at 96 GFLOP/s" in warnings[0], warnings
    assert "--autocast-bf16" in warnings[0] and "slower" in warnings[0] and "--bf16-products auto" in warnings[0]


def test_a_device_slower_in_bfloat16_takes_float32_kernels_and_says_so(rates, caplog):
    rates(96.0, 21.0)
    with caplog.at_level(logging.INFO):
        autocast_bf16.warn_if_bf16_is_slow("cpu")
        autocast_bf16.warn_if_bf16_is_slow("cpu")  # said once a process
    said = [r.getMessage() for r in caplog.records if "--autocast-bf16" in r.getMessage()]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "through float32 kernels" in said[0] and "21 GFLOP/s" in said[0], said


def test_a_device_with_native_bfloat16_gets_no_warning(rates, caplog):
    rates(96.0, 420.0)
    with caplog.at_level(logging.INFO):
        autocast_bf16.warn_if_bf16_is_slow("cpu")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_layers_gelu_on_bfloat16_equals_fairseqs_without_a_float32_copy():
    """fairseq's gelu computes gelu(h.float()).type_as(h); the layer's own on bfloat16 states gives the same bits."""
    from fairseq import utils as fairseq_utils

    from fairseq_clusterformer.layers.settings import LayerSettings
    from fairseq_clusterformer.layers.windowed import SlidingWindowLayer

    layer = SlidingWindowLayer(LayerSettings(embed_dim=16, ffn_dim=32, heads=2, window_size=8, window_stride=4,
                                             activation_fn="gelu"))  # fmt: skip
    h = (torch.randn(3, 50, 32) * 4).to(torch.bfloat16)
    ours = layer._activation(h)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, fairseq_utils.get_activation_fn("gelu")(h))
    with torch.profiler.profile() as prof:
        layer._activation(h)
    assert not [e for e in prof.events() if e.name in ("aten::_to_copy", "aten::copy_")]
    h32 = torch.randn(3, 50, 32)
    assert torch.equal(layer._activation(h32), fairseq_utils.get_activation_fn("gelu")(h32))
