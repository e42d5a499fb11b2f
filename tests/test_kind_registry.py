"""A long-range kind is one class and one row of ``layers.kinds``: a throwaway kind (far keys at random), registered
here, is offered by the QA model's --long-range-layer, built at the long-range positions and trained for one update;
an unknown kind is refused, naming the known ones.

B = batch, T = tokens.
"""

import pytest
import torch
from fairseq import tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_clusterformer.layers.build import build_layer
from fairseq_clusterformer.layers.kinds import (
    KINDS,
    LongRangeKind,
    LongRangePlan,
    long_range_help,
    long_range_kind,
    register_kind,
)
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.sorted_window import SortedWindowLayer
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_model import batch, parse


class RandomFarKeysLayer(SortedWindowLayer):
    """Each token joins one of --window-stride groups drawn at random at every forward: far keys chosen without
    looking at the text (a control no paper asked for, which is why it lives in a test)."""

    kind = "random"

    def __init__(self, settings: LayerSettings, causality: str = "strict", values: str = "own") -> None:
        super().__init__(settings, settings.window_stride, causality, values=values)

    def group_ids(self, x: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        ids = torch.randint(self.num_groups, x.shape[:2], device=x.device)  # B x T
        return ids if padding_mask is None else ids.masked_fill(padding_mask, self.num_groups)


class PlainOptimizer:
    """What fairseq's FairseqOptimizer.backward does without a loss scaler."""

    def backward(self, loss):
        loss.backward()


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


@pytest.fixture
def random_kind():
    row = LongRangeKind(RandomFarKeysLayer, None, "random far-key", "far keys at random (a test's kind)")
    register_kind(row)
    yield row
    del KINDS[row.name]


def test_a_registered_kind_is_offered_built_and_trained_for_one_update(qa_data, random_kind):
    args = parse(qa_data, "--long-range-layer", "random", "--num-clusters", "4")
    assert args.long_range_layer == "random"
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    layers = model.encoder.sentence_encoder.layers  # clusterformer_qa_tiny: long-range layers 2, 4
    assert [type(layer) for layer in layers] == [SlidingWindowLayer, RandomFarKeysLayer] * 2
    criterion = task.build_criterion(cfg.criterion)
    before = [p.detach().clone() for p in layers[1].parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    loss, sample_size, _ = task.train_step(batch(task, "train", [0, 1]), model, criterion, PlainOptimizer(), 0)
    optimizer.step()
    assert torch.isfinite(loss) and sample_size > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert any(not torch.equal(a, b) for a, b in zip(before, layers[1].parameters())), "the kind's layer never moved"
    # what the row says follows from its class: no clusters to refresh, no --num-clusters groups
    assert not random_kind.uses_clusters and not random_kind.grouped
    assert "'random' = far keys at random (a test's kind), 'none' = " in long_range_help()


def test_a_registered_kind_builds_causal_layers_and_refuses_a_hybrid(random_kind):
    # the language model's flag is fixed when lm/model.py is imported (a ChoiceEnum), but its layers are built
    # through the same plan and build_layer
    settings = LayerSettings(8, 16, 2, 4, 2)
    layer = build_layer(2, settings, LongRangePlan(frozenset({2}), "random", 4, "strict")).eval()
    x = torch.randn(2, 9, 8)  # B x T x C
    assert isinstance(layer, RandomFarKeysLayer) and layer(x).shape == x.shape
    with pytest.raises(ValueError, match="--long-range-mode hybrid .* needs --long-range-layer cluster, lsh, sparse"):
        LongRangePlan(frozenset({2}), "random", mode="hybrid")
    with pytest.raises(ValueError, match="'random' is taken"):
        register_kind(random_kind)


def test_an_unknown_kind_is_refused_naming_the_known_ones(qa_data, capsys):
    known = "('cluster', 'lsh', 'sparse', 'none')"
    for refuse in (lambda: LongRangePlan(frozenset({2}), "kmeans"), lambda: long_range_kind("kmeans")):
        with pytest.raises(ValueError) as error:
            refuse()
        assert str(error.value) == f"--long-range-layer must be one of {known}, got 'kmeans'"
    with pytest.raises(SystemExit):
        parse(qa_data, "--long-range-layer", "kmeans")
    err = capsys.readouterr().err
    assert f"argument --long-range-layer: invalid choice: 'kmeans' (choose from {known[1:-1]})" in err
