"""``--compile-layers auto`` is the default of the LM and the QA model: compiled where a layer's input is on CUDA
(an H200 ran the compiled layers 1.3-2.0x faster than eager), eager on a CPU (nothing gained there). A checkpoint
that recorded ``off`` keeps it when loaded; one from before the flag takes the default."""

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf, open_dict

from fairseq_clusterformer.layers.compiled import DEFAULT_COMPILE, check_compile_mode, wants_compile
from fairseq_clusterformer.layers.windowed import WindowedTransformerLayer
from tests.data.qa_model.synthetic import shared_data
from tests.test_model import build as build_lm
from tests.test_model import parse as parse_lm
from tests.test_qa_model import batch
from tests.test_qa_model import build as build_qa


def test_auto_runs_eager_on_a_torch_too_old_to_compile_and_on_names_the_flag_there(monkeypatch):
    monkeypatch.setattr(torch, "compiler", object())  # torch < 2.3 has no torch.compiler.is_compiling
    assert check_compile_mode("auto") == "off" and check_compile_mode("off") == "off"
    with pytest.raises(ValueError, match="--compile-layers on needs torch >= 2.3"):
        check_compile_mode("on")


def compile_modes(model) -> set[str]:
    return {m.compile_mode for m in model.modules() if isinstance(m, WindowedTransformerLayer)}


@pytest.fixture
def compile_calls(monkeypatch):
    """Every ``torch.compile`` call, counted (and not made)."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(fn) or fn)
    return calls


def test_the_default_is_auto_and_auto_is_eager_on_a_cpu_tensor():
    assert DEFAULT_COMPILE == "auto"
    x = torch.zeros(1, 4, 8)  # B x T x C
    assert not wants_compile("auto", x) and wants_compile("on", x)


def test_the_lm_on_a_cpu_runs_eager_with_the_default(lm_data, compile_calls):
    task, model = build_lm(lm_data)
    assert compile_modes(model) == {"auto"}
    tokens = torch.randint(4, len(task.dictionary), (2, 40))
    model.train()
    model(tokens, src_lengths=torch.full((2,), 40))[0].sum().backward()
    model.eval()
    with torch.no_grad():
        model(tokens, src_lengths=torch.full((2,), 40))
    assert compile_calls == []


def test_the_qa_model_on_a_cpu_runs_eager_with_the_default(tmp_path_factory, compile_calls):
    task, model = build_qa(shared_data(tmp_path_factory))
    assert compile_modes(model) == {"auto"}
    sample = batch(task, "valid", [0, 1])
    with torch.no_grad():
        model(**sample["net_input"])
    assert compile_calls == []


def save(model, cfg, path):
    """A checkpoint as fairseq writes one: its config, its weights."""
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam", "lr_scheduler_state": {}}]
    state = {"cfg": cfg, "model": model.state_dict(), "optimizer_history": history, "extra_state": {}}
    state["last_optimizer_state"] = None
    torch.save(state, path)
    return str(path)


@pytest.mark.parametrize("recorded", ["off", None])
def test_a_checkpoint_keeps_its_recorded_off_and_one_without_the_flag_takes_auto(lm_data, tmp_path, recorded):
    cfg = convert_namespace_to_omegaconf(parse_lm(lm_data, "--compile-layers", recorded or "auto"))
    task, model = build_lm(lm_data, "--compile-layers", recorded or "auto")
    if recorded is None:  # a checkpoint from before --compile-layers existed
        with open_dict(cfg.model):
            del cfg.model["compile_layers"]
    path = save(model, OmegaConf.to_container(cfg), tmp_path / "checkpoint_last.pt")
    [loaded], _ = checkpoint_utils.load_model_ensemble([path])
    assert compile_modes(loaded) == {recorded or "auto"}
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
