"""A long-range run and the sliding-window run of one seed start as the same run: the long-range layers draw their
random numbers (initial centroids, LSH's training rotations) from streams of their own (``layers.streams``), so every
weight (the QA heads built after the encoder included) and every dropout mask is the sliding-window model's. Table b's
paired differences then compare what the layers do, not two random starts."""

import pytest
import torch
from fairseq import tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_clusterformer.layers.kinds import KINDS
from fairseq_clusterformer.layers.sorted_window import SortedWindowLayer
from fairseq_clusterformer.layers.streams import DrawCounter, stream_seed
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_model import batch, parse

HYBRIDS = [name for name, kind in KINDS.items() if kind.hybrid]  # each runs replace and hybrid
# hidden dropout on: its masks must be the same in both runs; attention dropout off, as in table b's CPU runs (the
# hybrid's far branch draws attention-dropout masks the sliding-window layer does not)
DROPOUT = ("--dropout", "0.1")


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


def built(data, *flags, seed=11):
    """The QA model as fairseq-train builds it: torch seeded with --seed, then the task's build_model."""
    cfg = convert_namespace_to_omegaconf(parse(data, "--num-clusters", "4", *DROPOUT, *flags))
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    return task, model, torch.rand(3)  # where torch's stream stands once the model is built


def long_range(model):
    return [m for m in model.modules() if isinstance(m, SortedWindowLayer)]


@pytest.mark.parametrize("mode", ["replace", "hybrid"])
@pytest.mark.parametrize("kind", HYBRIDS)
def test_a_long_range_model_has_the_sliding_window_models_weights_and_leaves_the_stream_where_it_does(
    qa_data, kind, mode
):
    _, windows, after_windows = built(qa_data, "--long-range-layer", "none")
    _, ours, after_ours = built(qa_data, "--long-range-layer", kind, "--long-range-mode", mode)
    assert long_range(ours), "the flags built long-range layers"
    theirs = dict(windows.named_parameters())
    own = {name for name, _ in ours.named_parameters() if name not in theirs}
    assert all(name.endswith("long_range_gate") for name in own) and (mode == "hybrid") == bool(own)
    for name, value in ours.named_parameters():
        if name in theirs:
            assert torch.equal(value, theirs[name]), name  # the QA heads included: built after the encoder
    assert torch.equal(after_ours, after_windows)


@pytest.mark.parametrize("kind", HYBRIDS)
def test_a_hybrid_training_step_at_update_0_is_the_sliding_window_models(qa_data, kind):
    task, windows, _ = built(qa_data, "--long-range-layer", "none")
    _, hybrid, _ = built(qa_data, "--long-range-layer", kind, "--long-range-mode", "hybrid")
    sample = batch(task, "valid", [0, 1, 2])["net_input"]
    assert sample["context"].size(1) > 3 * 32  # several windows: the far branch has far tokens to reach
    results = {}
    for name, model in (("windows", windows), ("hybrid", hybrid)):
        model.double().train()
        torch.manual_seed(5)  # fairseq seeds every update with --seed + the update number
        out = model(**sample)
        (out["start"].logsumexp(-1).sum() + out["end"].logsumexp(-1).sum()).backward()
        results[name] = (out, torch.rand(3))
    (ours, ours_after), (theirs, theirs_after) = results["hybrid"], results["windows"]
    for key in ("start", "end"):
        assert torch.allclose(ours[key], theirs[key], atol=1e-10, rtol=0)  # the same dropout masks
    assert torch.equal(ours_after, theirs_after)
    grads = dict(windows.named_parameters())
    for name, value in hybrid.named_parameters():
        if name.endswith("long_range_gate"):
            assert float(value.grad.abs().min()) > 0  # the gate still learns: the far branch is computed
        else:
            assert torch.allclose(value.grad, grads[name].grad, atol=1e-9, rtol=0), name


def test_two_layers_and_two_seeds_draw_apart_and_one_seed_repeats(qa_data):
    _, model, _ = built(qa_data, "--long-range-layer", "cluster", seed=11)
    _, again, _ = built(qa_data, "--long-range-layer", "cluster", seed=11)
    _, other, _ = built(qa_data, "--long-range-layer", "cluster", seed=12)
    first, second = (layer.centroids for layer in long_range(model))
    assert not torch.equal(first, second)
    assert all(torch.equal(a.centroids, b.centroids) for a, b in zip(long_range(model), long_range(again)))
    assert not torch.equal(first, long_range(other)[0].centroids)


def test_the_draw_count_restarts_when_torch_is_seeded_with_another_value():
    counter = DrawCounter(stream=6)
    torch.manual_seed(40)
    seeds = [counter.next_generator().initial_seed() for _ in range(3)]
    assert seeds == [stream_seed(6, draw, base=40) for draw in range(3)] and len(set(seeds)) == 3
    torch.manual_seed(41)  # fairseq's next update
    assert counter.next_generator().initial_seed() == stream_seed(6, 0, base=41)
    torch.manual_seed(40)  # a resumed run, back at the first update
    assert counter.next_generator().initial_seed() == seeds[0]
    counter.restart()
    assert counter.next_generator().initial_seed() == seeds[0]  # torch seeded again, with the value it had
