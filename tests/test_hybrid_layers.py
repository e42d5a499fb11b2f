"""--long-range-mode hybrid: the sliding window kept, the long-range attention added through a gate that starts at 0."""

import copy

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models.roberta import RobertaModel

from fairseq_clusterformer.layers.build import build_layer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.hybrid import HybridLongRange, HybridSparseLayer
from fairseq_clusterformer.layers.kinds import KINDS, LongRangePlan
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from tests.conftest import PACKAGE
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_model import batch, build, parse

HYBRIDS = [name for name, kind in KINDS.items() if kind.hybrid]


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


def hybrid_and_windows(data, kind, *extra):
    """The hybrid QA model and the sliding-window-only one, both loaded from the same pretrained RoBERTa weights."""
    flags = ["--long-range-layer", kind, "--num-clusters", "4", *extra]
    task, hybrid = build(data, *flags, "--long-range-mode", "hybrid")
    _, windows = build(data, "--long-range-layer", "none", *extra)
    torch.manual_seed(1)
    roberta = RobertaModel.build_model(copy.deepcopy(parse(data, "--long-range-layer", "none")), task).eval()
    for model in (hybrid, windows):
        model.load_state_dict(copy.deepcopy(roberta.state_dict()))
        # the QA heads are new in both: give them the same values
        model.qa_heads.load_state_dict(windows.qa_heads.state_dict())
    return task, hybrid.double(), windows.double()


def hybrid_layers(model):
    return [layer for layer in model.encoder.sentence_encoder.layers if isinstance(layer, HybridLongRange)]


@pytest.mark.parametrize("merge", ["layer", "attention"])
@pytest.mark.parametrize("kind", HYBRIDS)
def test_at_initialisation_the_hybrid_model_is_the_sliding_window_model(qa_data, kind, merge):
    task, hybrid, windows = hybrid_and_windows(qa_data, kind, "--window-merge", merge)
    assert len(hybrid_layers(hybrid)) == 2 and all(
        float(g.long_range_gate.detach().abs().sum()) == 0 for g in hybrid_layers(hybrid)
    )
    sample = batch(task, "valid", [0, 1, 2])["net_input"]
    assert sample["context"].size(1) > 3 * 32  # several windows: the long-range branch has far tokens to reach
    ours, theirs = hybrid(**sample), windows(**sample)
    for key in ("start", "end"):
        assert torch.allclose(ours[key], theirs[key], atol=1e-6, rtol=0)
    with torch.no_grad():
        for layer in hybrid_layers(hybrid):
            layer.long_range_gate.fill_(0.5)
    moved = hybrid(**sample)
    assert not torch.allclose(moved["start"], theirs["start"], atol=1e-3)  # once open, the gate changes the output


@pytest.mark.parametrize("kind", HYBRIDS)
def test_the_gate_gets_a_gradient_at_initialisation(qa_data, kind):
    task, hybrid, _ = hybrid_and_windows(qa_data, kind)
    hybrid.train()
    out = hybrid(**batch(task, "valid", [0, 1])["net_input"])
    (out["start"].logsumexp(-1).sum() + out["end"].logsumexp(-1).sum()).backward()
    for layer in hybrid_layers(hybrid):
        assert layer.long_range_gate.grad is not None and float(layer.long_range_gate.grad.abs().min()) > 0


def test_an_open_gate_reaches_a_token_outside_the_window():
    """Sparse groups by offset t mod 12: token 120 is in token 0's sorted window, far outside its sliding windows."""
    settings = LayerSettings(embed_dim=16, ffn_dim=32, heads=2, window_size=16, window_stride=12, causal=False)
    torch.manual_seed(0)
    layer = HybridSparseLayer(settings, causality="paper").double().eval()
    x = torch.randn(1, 200, 16, dtype=torch.float64)
    far = x.clone()
    far[0, 120] += 1.0
    assert torch.equal(layer(x)[0, 0], layer(far)[0, 0])  # gate 0: the sliding window only
    with torch.no_grad():
        layer.long_range_gate.fill_(1.0)
    assert not torch.allclose(layer(x)[0, 0], layer(far)[0, 0], atol=1e-6)
    near = SlidingWindowLayer(settings).double().eval()
    near.load_state_dict({k: v for k, v in layer.state_dict().items() if k != "long_range_gate"})
    with torch.no_grad():
        layer.long_range_gate.zero_()
    assert torch.allclose(layer(x), near(x), atol=1e-12)  # gate 0 on any input: the sliding-window layer


def test_checkpoints_carry_the_gate(qa_data, tmp_path):
    _, hybrid = build(qa_data, "--long-range-mode", "hybrid", "--long-range-layer", "lsh", "--num-clusters", "4")
    with torch.no_grad():
        for i, layer in enumerate(hybrid_layers(hybrid)):
            layer.long_range_gate.copy_(torch.arange(4.0) + i)
    torch.save(hybrid.state_dict(), tmp_path / "model.pt")
    _, again = build(qa_data, "--long-range-mode", "hybrid", "--long-range-layer", "lsh", "--num-clusters", "4")
    again.load_state_dict(torch.load(tmp_path / "model.pt"))
    for saved, loaded in zip(hybrid_layers(hybrid), hybrid_layers(again)):
        assert torch.equal(saved.long_range_gate, loaded.long_range_gate)
    # a replacement-layer checkpoint has no gate: the hybrid model refuses it rather than start with a silent 0
    _, replace = build(qa_data, "--long-range-layer", "lsh", "--num-clusters", "4")
    with pytest.raises(RuntimeError, match="long_range_gate"):
        again.load_state_dict(replace.state_dict())


def test_the_kmeans_refresh_banks_the_hybrid_cluster_layers(qa_data):
    task, model = build(qa_data, "--long-range-mode", "hybrid", "--num-clusters", "4")
    layers = hybrid_layers(model)
    assert all(isinstance(layer, ClusterFormerLayer) for layer in layers)
    assert task.refresher.layers == layers and all(layer.banked for layer in layers)
    model.train()
    model(**batch(task, "train", [0, 1])["net_input"])
    task.refresher.commit()
    assert all(len(bank) > 0 for bank in task.refresher.banks)


def test_hybrid_flag_is_checked_and_named(qa_data):
    with pytest.raises(ValueError, match="--long-range-mode hybrid .* --long-range-layer none"):
        build(qa_data, "--long-range-mode", "hybrid", "--long-range-layer", "none")
    with pytest.raises(ValueError, match="--long-range-mode"):
        LongRangePlan(layers=frozenset({2}), mode="both")
    causal = LayerSettings(embed_dim=16, ffn_dim=32, heads=2, window_size=16, window_stride=8)
    with pytest.raises(ValueError, match="--long-range-mode hybrid"):
        build_layer(2, causal, LongRangePlan(layers=frozenset({2}), num_clusters=4, mode="hybrid"))
    _, replace = build(qa_data, "--long-range-layer", "sparse")
    assert not hybrid_layers(replace)  # the paper's replacement layer stays the default


def test_the_language_model_refuses_hybrid(lm_data):
    argv = [str(lm_data), "--user-dir", str(PACKAGE), "--task", "clusterformer_lm", "--arch", "clusterformer_lm_tiny"]
    args = options.parse_args_and_arch(options.get_training_parser(), [*argv, "--long-range-mode", "hybrid"])
    cfg = convert_namespace_to_omegaconf(args)
    with pytest.raises(ValueError, match="--long-range-mode hybrid is built for the QA encoder"):
        tasks.setup_task(cfg.task).build_model(cfg.model)


def test_a_resume_must_keep_the_mode_and_old_checkpoints_are_replace(qa_data):
    """``checkpoints.model_fit`` compares these: a hybrid checkpoint resumed as replace (or back) is refused by name,
    and a checkpoint from before the flag (no ``long_range_mode`` in its args) reads as the paper's layer."""
    from fairseq_clusterformer.qa.model import ClusterFormerQAModel

    hybrid = parse(qa_data, "--long-range-mode", "hybrid")
    replace = parse(qa_data)
    assert ClusterFormerQAModel.computing_settings(hybrid)["--long-range-mode"] == "hybrid"
    assert ClusterFormerQAModel.computing_settings(replace)["--long-range-mode"] == "replace"
    del replace.long_range_mode
    assert ClusterFormerQAModel.computing_settings(replace)["--long-range-mode"] == "replace"
