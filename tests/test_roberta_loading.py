"""A real fairseq RoBERTa checkpoint (masked_lm, trained here by fairseq-train) loads into the QA model: every layer,
the long-range ones included; rows matched by dictionary symbol; also as an old-style argparse.Namespace checkpoint."""

import shutil
import subprocess
import sys

import pytest
import torch
from fairseq import options

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.qa.model import BT_COPY
from tests.conftest import run_ok
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_model import build

ROBERTA = [
    "--arch",
    "roberta_base",
    "--encoder-layers",
    "3",
    "--encoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "64",
    "--encoder-attention-heads",
    "2",
    "--max-positions",
    "128",
]
QA_SHAPE = [*ROBERTA[2:], "--long-range-layers", "2", "--num-clusters", "4"]
MASKED_LM = [
    "--task",
    "masked_lm",
    "--criterion",
    "masked_lm",
    "--tokens-per-sample",
    "64",
    "--batch-size",
    "4",
    "--optimizer",
    "adam",
    "--lr",
    "1e-3",
    "--max-update",
    "3",
    "--cpu",
    "--num-workers",
    "0",
    "--no-epoch-checkpoints",
    "--seed",
    "3",
    *ROBERTA,
]


@pytest.fixture(scope="module")
def roberta_dir(lm_data, tmp_path_factory):
    """model.pt + dict.txt, the layout of the published RoBERTa tarballs, from a few masked-LM updates."""
    root = tmp_path_factory.mktemp("roberta")
    run_ok("fairseq-train", lm_data, *MASKED_LM, "--save-dir", root / "ckpt")
    shutil.copy(root / "ckpt" / "checkpoint_last.pt", root / "model.pt")
    shutil.copy(lm_data / "dict.txt", root / "dict.txt")
    return root


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


def pretrained(path):
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def assert_roberta_weights(model, state, pretrained_symbols):
    ours = model.state_dict()
    # fairseq 0.12.2's layers also save fused copies of their weights (in_proj_weight, fc1_weight, ...) for its
    # BetterTransformer path; the model drops them, and the separate weights they copy are compared below
    encoder = [
        k
        for k in state
        if k.startswith("encoder.sentence_encoder.") and "embed_tokens" not in k and not BT_COPY.search(k)
    ]
    assert any(".layers.1." in k for k in encoder)  # the long-range layer (number 2) is among them
    for key in encoder:
        assert torch.equal(ours[key], state[key]), key
    rows = state["encoder.sentence_encoder.embed_tokens.weight"]
    ours_rows = ours["encoder.sentence_encoder.embed_tokens.weight"]
    index = {symbol: i for i, symbol in enumerate(pretrained_symbols)}
    shared = [(i, index[s]) for i, s in enumerate(model.encoder.dictionary.symbols) if s in index]
    assert len(shared) >= 5  # <s> <pad> </s> <unk> and some pieces
    for i, j in shared:
        assert torch.equal(ours_rows[i], rows[j])
    assert not any(k.startswith("encoder.lm_head") for k in ours)


def test_roberta_path_loads_every_layer_by_symbol(roberta_dir, qa_data):
    from fairseq.data import Dictionary

    task, model = build(qa_data, *QA_SHAPE, "--roberta-path", roberta_dir)
    layers = model.encoder.sentence_encoder.layers
    assert isinstance(layers[1], ClusterFormerLayer)
    symbols = Dictionary.load(str(roberta_dir / "dict.txt")).symbols
    assert len(task.source_dictionary) != len(symbols)  # different vocabularies: rows must go by symbol
    assert_roberta_weights(model, pretrained(roberta_dir / "model.pt"), symbols)


def test_a_mismatched_roberta_is_refused(roberta_dir, qa_data, tmp_path):
    with pytest.raises(ValueError, match="--max-positions"):
        build(qa_data, *QA_SHAPE, "--max-positions", "100", "--roberta-path", roberta_dir)
    with pytest.raises(RuntimeError, match="layers.3"):
        build(qa_data, *QA_SHAPE, "--encoder-layers", "4", "--roberta-path", roberta_dir)
    alone = tmp_path / "model.pt"
    shutil.copy(roberta_dir / "model.pt", alone)  # no dict.txt beside it, different vocabulary sizes
    with pytest.raises(ValueError, match="--roberta-dict"):
        build(qa_data, *QA_SHAPE, "--roberta-path", alone)
    with pytest.raises(FileNotFoundError, match="--roberta-path"):
        build(qa_data, *QA_SHAPE, "--roberta-path", tmp_path / "missing.pt")


@pytest.fixture(scope="module")
def namespace_checkpoint(roberta_dir, lm_data):
    """The same checkpoint as the published ones store it: options as an argparse.Namespace, no cfg."""
    args = options.parse_args_and_arch(options.get_training_parser(), [str(lm_data), *MASKED_LM])
    state = torch.load(roberta_dir / "model.pt", map_location="cpu", weights_only=False)
    state["args"] = args
    state.pop("cfg", None)
    path = roberta_dir.parent / "namespace" / "model.pt"
    path.parent.mkdir()
    torch.save(state, path)
    shutil.copy(roberta_dir / "dict.txt", path.parent / "dict.txt")
    return path


def test_namespace_checkpoints_need_the_allow_list(namespace_checkpoint):
    """torch's default (weights_only) refuses the file; fairseq's loader reads it once the plug-in is imported."""
    plain = f"import torch; torch.load({str(namespace_checkpoint)!r}, map_location='cpu')"
    refused = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True)
    if tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 6):  # weights_only is the default
        assert refused.returncode != 0 and "Namespace" in refused.stderr
    loaded = (
        "import fairseq_clusterformer; from fairseq import checkpoint_utils; "
        f"s = checkpoint_utils.load_checkpoint_to_cpu({str(namespace_checkpoint)!r}); print(s['cfg'].model.arch)"
    )
    done = subprocess.run([sys.executable, "-c", loaded], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("roberta_base")


def test_namespace_checkpoint_loads_through_roberta_path(namespace_checkpoint, qa_data):
    from fairseq.data import Dictionary

    _, model = build(qa_data, *QA_SHAPE, "--roberta-path", namespace_checkpoint)
    symbols = Dictionary.load(str(namespace_checkpoint.parent / "dict.txt")).symbols
    assert_roberta_weights(model, pretrained(namespace_checkpoint), symbols)


@pytest.mark.e2e
def test_restore_file_fine_tunes_from_roberta_with_fairseq_train(namespace_checkpoint, qa_data, tmp_path):
    """The fairseq way: --restore-file with the --reset-* flags; one update with a negligible learning rate leaves
    the encoder at the pretrained weights, now in a QA checkpoint."""
    from fairseq.data import Dictionary

    out = run_ok(
        "fairseq-train",
        qa_data,
        "--user-dir",
        "fairseq_clusterformer",
        "--task",
        "clusterformer_qa",
        "--arch",
        "clusterformer_qa_tiny",
        *QA_SHAPE,
        "--criterion",
        "clusterformer_qa",
        "--max-question-tokens",
        "40",
        "--restore-file",
        namespace_checkpoint,
        "--roberta-dict",
        namespace_checkpoint.parent / "dict.txt",
        "--reset-optimizer",
        "--reset-dataloader",
        "--reset-meters",
        "--reset-lr-scheduler",
        "--optimizer",
        "sgd",
        "--lr",
        "1e-12",
        "--max-update",
        "1",
        "--batch-size",
        "2",
        "--kmeans-backend",
        "torch",
        "--memory-size",
        "100",
        "--save-dir",
        tmp_path / "ckpt",
        "--no-epoch-checkpoints",
        "--cpu",
        "--num-workers",
        "0",
        "--dropout",
        "0",
        "--attention-dropout",
        "0",
    )
    assert f"Loaded checkpoint {namespace_checkpoint}" in out
    qa_state = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    state = pretrained(namespace_checkpoint)
    symbols = Dictionary.load(str(namespace_checkpoint.parent / "dict.txt")).symbols
    index = {s: i for i, s in enumerate(symbols)}
    for key, value in state.items():
        if key.startswith("encoder.sentence_encoder.layers.") and not BT_COPY.search(key):
            assert torch.allclose(qa_state[key], value, atol=1e-8), key
    qa_symbols = Dictionary.load(str(qa_data / "dict.txt")).symbols
    rows = qa_state["encoder.sentence_encoder.embed_tokens.weight"]
    for i, symbol in enumerate(qa_symbols):
        if symbol in index and symbol != "<pad>":
            assert torch.allclose(rows[i], state["encoder.sentence_encoder.embed_tokens.weight"][index[symbol]])
    assert any(k.startswith("qa_heads.") for k in qa_state)
