"""The registered QA model, task and dataset, built in-process through fairseq's own argument parser."""

import copy
import json
import shutil

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models.roberta import RobertaModel

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit
from fairseq_clusterformer.qa.data.dataset import QADataset, QALimits
from tests.conftest import PACKAGE
from tests.data.qa_model.synthetic import shared_data


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


@pytest.fixture(scope="module")
def nq_data(tmp_path_factory):
    return shared_data(tmp_path_factory, nq=True)


def parse(data, *extra, arch="clusterformer_qa_tiny"):
    parser = options.get_training_parser()
    argv = [
        str(data),
        "--user-dir",
        str(PACKAGE),
        "--task",
        "clusterformer_qa",
        "--arch",
        arch,
        "--criterion",
        "clusterformer_qa",
        "--dropout",
        "0",
        "--attention-dropout",
        "0",
        "--max-question-tokens",
        "40",
        "--memory-size",
        "1000",
        *map(str, extra),
    ]
    return options.parse_args_and_arch(parser, argv)


def build(data, *extra, arch="clusterformer_qa_tiny"):
    cfg = convert_namespace_to_omegaconf(parse(data, *extra, arch=arch))
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)
    return task, task.build_model(cfg.model).eval()


def batch(task, split, indices):
    if split not in task.datasets:
        task.load_dataset(split)
    dataset = task.dataset(split)
    return dataset.collater([dataset[i] for i in indices])


def test_architectures_are_the_papers(qa_data):
    large = parse(qa_data, "--max-question-tokens", "64", arch="clusterformer_qa_large")
    assert (large.encoder_layers, large.encoder_embed_dim, large.encoder_attention_heads) == (24, 1024, 16)
    assert (large.long_range_layers, large.window_size, large.window_stride, large.max_positions) == (
        "15,20",
        256,
        224,
        512,
    )
    base = parse(qa_data, arch="clusterformer_qa_base")
    assert (base.encoder_layers, base.encoder_embed_dim, base.long_range_layers) == (12, 768, "8,10")
    _, model = build(qa_data)
    kinds = [type(layer) for layer in model.encoder.sentence_encoder.layers]
    assert kinds == [SlidingWindowLayer, ClusterFormerLayer, SlidingWindowLayer, ClusterFormerLayer]
    assert not any(layer.settings.causal for layer in model.encoder.sentence_encoder.layers)
    assert model.qa_heads.answer_type is None  # span data: no NQ heads
    _, model = build(qa_data, "--long-range-layer", "none")
    assert all(isinstance(layer, SlidingWindowLayer) for layer in model.encoder.sentence_encoder.layers)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--max-question-tokens", "100"], "--max-positions"),
        (["--long-range-layers", "1,3"], "layer 1"),
        (["--long-range-layers", "2,9"], "--long-range-layers"),
        (["--window-size", "24", "--window-stride", "24"], "--window-stride"),
        (["--encoder-layerdrop", "0.1"], "--encoder-layerdrop"),
    ],
)
def test_bad_model_flags_name_the_flag(qa_data, flags, message):
    with pytest.raises(ValueError, match=message):
        build(qa_data, *flags)


@pytest.mark.parametrize("kind", ["cluster", "lsh", "none"])
def test_an_example_gives_the_same_output_alone_and_in_a_padded_batch(qa_data, kind):
    task, model = build(qa_data, "--long-range-layer", kind, "--num-clusters", "4")
    model.double()
    task.load_dataset("valid")
    sizes = task.dataset("valid").sizes
    short, long = int(sizes.argmin()), int(sizes.argmax())
    alone = model(**batch(task, "valid", [short])["net_input"])
    together = model(**batch(task, "valid", [long, short])["net_input"])
    length = alone["start"].size(1)
    assert together["start"].size(1) > length
    for key in ("start", "end"):
        assert torch.allclose(together[key][1, :length], alone[key][0], atol=1e-9)


def test_one_window_equals_fairseq_roberta_on_the_same_weights(qa_data):
    """With every context token in one window, the encoder is RoBERTa on its sentence-pair input
    ``<s> question </s></s> context </s>``: same weights, same positions, same states."""
    flags = ["--window-size", "100", "--window-stride", "60", "--max-positions", "256", "--long-range-layer", "none"]
    task, model = build(qa_data, *flags)
    args = parse(qa_data, *flags)
    torch.manual_seed(1)
    roberta = RobertaModel.build_model(copy.deepcopy(args), task).eval()
    model.load_state_dict(roberta.state_dict())  # a RoBERTa state dict: LM head dropped, QA heads kept
    sample = batch(task, "valid", [0])
    question = sample["net_input"]["question"]
    context = sample["net_input"]["context"][:, :55]  # one window of context (<= stride)
    d = task.source_dictionary
    bos, eos = torch.tensor([[d.bos()]]), torch.tensor([[d.eos()]])
    tokens = torch.cat([bos, question, eos, eos, context, eos], dim=1)
    expected, _ = roberta.encoder.extract_features(tokens)  # 1 x (q+3+T+1) x C
    out = model.encoder.sentence_encoder.forward_qa(question, context)
    q = question.size(1) + 3
    assert out.context.shape[1] == context.size(1)  # the closing </s> is not a context position
    assert torch.allclose(out.context[0], expected[0, q:-1], atol=1e-5)
    assert torch.allclose(out.question[0, 0], expected[0, :q], atol=1e-5)


def test_nq_data_adds_the_answer_type_and_paragraph_heads(nq_data):
    task, model = build(nq_data)
    assert task.answer_types and model.qa_heads.answer_type is not None
    sample = batch(task, "valid", [0, 1, 2])
    logits = model(**sample["net_input"])
    assert logits["answer_type"].shape == (3, 5)  # none, long, short, yes, no
    assert logits["paragraph"].shape == sample["net_input"]["context"].shape
    kinds = sample["answer_type"].tolist()
    assert set(kinds) <= {0, 2} and all((k == 0) == (la < 0) for k, la in zip(kinds, sample["long_answer"].tolist()))


def test_answer_type_pools_only_the_examples_own_windows(nq_data):
    task, model = build(nq_data)
    model.double()
    task.load_dataset("valid")
    sizes = task.dataset("valid").sizes
    short, long = int(sizes.argmin()), int(sizes.argmax())
    alone = model(**batch(task, "valid", [short])["net_input"])["answer_type"]
    together = model(**batch(task, "valid", [long, short])["net_input"])["answer_type"]
    assert torch.allclose(together[1], alone[0], atol=1e-9)


def corrupt(data, tmp_path, edit):
    """A copy of the data whose valid meta lines are changed by ``edit(index, meta)``."""
    copy_dir = tmp_path / "bin"
    shutil.copytree(data, copy_dir)
    path = copy_dir / "valid.meta.jsonl"
    metas = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(edit(i, m)) + "\n" for i, m in enumerate(metas)))
    return copy_dir


def test_bad_examples_are_counted_and_left_out_never_shifted(qa_data, tmp_path):
    def edit(i, meta):
        if i == 0:
            meta["spans"] = [[5, 10_000]]  # past the context
        if i == 1:
            meta["spans"] = [[0, 2]]  # on the paragraph token
        if i == 2:
            meta["spans"] = []  # no gold: fine for evaluation, nothing to learn in training
        return meta

    split = QABinarizedSplit(str(corrupt(qa_data, tmp_path, edit)), "valid")
    evaluation = QADataset(split, QALimits(40, 10_000), pad=1)
    assert evaluation.skipped == {"bad_span": 2}
    assert [item.index for item in evaluation.items] == list(range(2, len(split)))
    training = QADataset(split, QALimits(40, 10_000, training=True), pad=1)
    assert training.skipped == {"bad_span": 2, "no_gold_span_in_context": 1}
    for item in training.items:  # the kept spans are the binarised ones, unchanged
        assert item.spans == [tuple(s) for s in split.metas[item.index]["spans"]]
    assert "bad_span: 2" in training.report() and "no_gold_span_in_context: 1" in training.report()


def test_long_contexts_and_questions_are_skipped_or_truncated(qa_data):
    split = QABinarizedSplit(str(qa_data), "valid")
    lengths = split.context_sizes
    limit = int(sorted(lengths)[len(lengths) // 2])
    over = int((lengths > limit).sum())
    skipping = QADataset(split, QALimits(40, limit, context_overflow="skip"), pad=1)
    assert skipping.skipped == {"context_too_long": over} and len(skipping) == len(split) - over
    truncating = QADataset(split, QALimits(40, limit, context_overflow="truncate", training=True), pad=1)
    assert all(item.context_len <= limit for item in truncating.items)
    for item in truncating.items:
        assert all(end < item.context_len for _, end in item.spans) and item.spans
        sample = truncating[truncating.items.index(item)]
        assert len(sample["context"]) == item.context_len
    short_question = QADataset(split, QALimits(int(split.question_sizes.min()) - 1, 10_000), pad=1)
    assert short_question.skipped == {"question_too_long": len(split)}


def test_no_usable_example_is_a_clear_error(qa_data):
    task, _ = build(qa_data, "--max-context-eval", "10", "--context-overflow", "skip")
    with pytest.raises(ValueError, match="no usable example in split 'valid'.*context_too_long"):
        task.load_dataset("valid")
