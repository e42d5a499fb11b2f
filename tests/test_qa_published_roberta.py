"""A checkpoint in the layout of fairseq's published roberta.base / roberta.large loads into the QA model, both through
--roberta-path and through fairseq's own checkpoint loader (--restore-file), every weight equal to the source.

The published files predate fairseq 0.12's encoder: ``decoder.sentence_encoder.*`` keys, ``emb_layer_norm``, a fused
``self_attn.in_proj_weight`` / ``in_proj_bias``, no ``version`` entry, options as an ``argparse.Namespace`` (no
``cfg``), a GPT-2 dictionary of 50,265 rows (with ``<mask>``) and 514 positions. The test writes one from a tiny
fairseq RoBERTa, converting its keys to that layout, and binarises QA data with a GPT-2-style byte-level BPE whose
ids all lie in that dictionary, so that every embedding row can be compared too.
"""

import json
import random
import re
import types

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.data import Dictionary
from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode
from fairseq.models.roberta import RobertaModel

from fairseq_clusterformer.qa.scripts import binarize as qa_binarize
from tests.conftest import PACKAGE, run_ok
from tests.data.qa_model.synthetic import write_records
from tests.test_qa_model import build, parse

LAYERS, DIM = 3, 16
ROBERTA = [
    "--encoder-layers", str(LAYERS), "--encoder-embed-dim", str(DIM), "--encoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--max-positions", "512",
]  # fmt: skip
QA_SHAPE = [*ROBERTA, "--long-range-layers", "2", "--num-clusters", "4"]
GPT2_SYMBOLS = 50257  # BPE ids in GPT-2's encoder.json; fairseq's dict.txt adds three "madeupword" rows
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """encoder.json / vocab.bpe of a byte-level BPE (every byte plus a few merges) and a dict.txt in the layout of
    fairseq's GPT-2 dict.txt: all 50,257 BPE ids as symbols in a frequency order, then three made-up words."""
    root = tmp_path_factory.mktemp("gpt2")
    pieces = [*bytes_to_unicode().values(), *("".join(m) for m in MERGES)]
    (root / "encoder.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}))
    (root / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    ids = list(range(GPT2_SYMBOLS))
    random.Random(0).shuffle(ids)
    lines = [f"{i} {GPT2_SYMBOLS + 10 - rank}" for rank, i in enumerate(ids)]
    lines += [f"madeupword{k:04d} 0" for k in range(3)]
    (root / "dict.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def qa_data(gpt2, tmp_path_factory):
    root = tmp_path_factory.mktemp("qa_gpt2")
    write_records(root / "train.jsonl", 6, 1, (2, 3))
    write_records(root / "valid.jsonl", 4, 2, (2, 3))
    flags = ["--encoder-json", gpt2 / "encoder.json", "--vocab-bpe", gpt2 / "vocab.bpe", "--dict", gpt2 / "dict.txt"]
    splits = ["--train", root / "train.jsonl", "--valid", root / "valid.jsonl", "--destdir", root / "bin"]
    qa_binarize.main(qa_binarize.get_parser().parse_args([str(a) for a in [*flags, *splits]]))
    return root / "bin"


def old_layout(state: dict) -> dict:
    """A fairseq 0.12 RoBERTa state dict in the layout of the published checkpoints."""
    old = {}
    for key, value in state.items():
        if key.endswith(".version"):
            continue  # the published files have none
        key = "decoder." + key[len("encoder.") :]
        old[key.replace(".layernorm_embedding.", ".emb_layer_norm.")] = value
    for i in range(LAYERS):
        attn = f"decoder.sentence_encoder.layers.{i}.self_attn."
        for kind in ("weight", "bias"):
            # fairseq fused q, k and v in this order along the output dimension
            parts = [old.pop(f"{attn}{proj}.{kind}") for proj in ("q_proj", "k_proj", "v_proj")]
            old[f"{attn}in_proj_{kind}"] = torch.cat(parts)
    return old


@pytest.fixture(scope="module")
def published(gpt2, tmp_path_factory):
    """model.pt + dict.txt as in roberta.base.tar.gz, with random (seeded) weights: returns the directory."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [str(gpt2), "--task", "masked_lm", "--criterion", "masked_lm", "--arch", "roberta_base", *ROBERTA],
    )
    dictionary = Dictionary.load(str(gpt2 / "dict.txt"))
    dictionary.add_symbol("<mask>")  # as fairseq's masked_lm task does
    torch.manual_seed(1)
    model = RobertaModel.build_model(args, types.SimpleNamespace(source_dictionary=dictionary))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()  # no two weights alike (layer norms included), so that a swap cannot pass
    state = old_layout(model.state_dict())
    assert state["decoder.sentence_encoder.embed_tokens.weight"].shape == (50265, DIM)
    assert state["decoder.sentence_encoder.embed_positions.weight"].shape == (514, DIM)
    root = tmp_path_factory.mktemp("roberta_published")
    history = [{"criterion_name": "MaskedLmLoss", "optimizer_name": "FairseqAdam", "num_updates": 500000}]
    history[0]["lr_scheduler_state"] = {"best": 1.5}
    extra = {"epoch": 1, "val_loss": 1.5, "train_iterator": {"epoch": 1, "iterations_in_epoch": 0}}
    checkpoint = {"args": args, "model": state, "optimizer_history": history, "extra_state": extra}
    torch.save({**checkpoint, "last_optimizer_state": {}}, root / "model.pt")
    (root / "dict.txt").write_text((gpt2 / "dict.txt").read_text())
    return root


def assert_every_weight(model, source: dict, pretrained_symbols: list) -> None:
    """Each pretrained weight, in its new name, equals the model's; the embedding rows by symbol."""
    ours = model.state_dict()
    compared = set()
    for key, value in source.items():
        if key.startswith("decoder.lm_head."):
            continue  # QA has no masked-LM head
        new = "encoder." + key[len("decoder.") :].replace(".emb_layer_norm.", ".layernorm_embedding.")
        compared.add(key)
        if key.endswith("embed_tokens.weight"):
            continue
        if ".in_proj_" in key:
            kind = key.rsplit("_", 1)[1]
            parts = [ours[new.replace("in_proj_" + kind, f"{p}.{kind}")] for p in ("q_proj", "k_proj", "v_proj")]
            fused = torch.cat(parts)
            assert torch.equal(fused, value), key
        else:
            assert torch.equal(ours[new], value), key
    assert len(compared) == len(source) - sum(k.startswith("decoder.lm_head.") for k in source)
    rows = source["decoder.sentence_encoder.embed_tokens.weight"]
    index = {symbol: i for i, symbol in enumerate([*pretrained_symbols, "<mask>"])}
    ours_rows = ours["encoder.sentence_encoder.embed_tokens.weight"]
    qa_symbols = model.encoder.dictionary.symbols
    shared = [(i, index[s]) for i, s in enumerate(qa_symbols) if s in index]
    assert len(shared) == len(qa_symbols) - 1  # all but the paragraph symbol
    mine, theirs = zip(*shared)
    assert torch.equal(ours_rows[list(mine)], rows[list(theirs)])
    assert ours["encoder.sentence_encoder.version"].item() == 1  # fairseq's mark for "no final layer norm"


def source_state(published) -> dict:
    return torch.load(published / "model.pt", map_location="cpu", weights_only=False)["model"]


def test_the_test_checkpoint_has_the_published_layout(published):
    checkpoint = torch.load(published / "model.pt", map_location="cpu", weights_only=False)
    assert "cfg" not in checkpoint and type(checkpoint["args"]).__name__ == "Namespace"
    keys = checkpoint["model"]
    assert "decoder.sentence_encoder.layers.0.self_attn.in_proj_weight" in keys
    assert "decoder.sentence_encoder.emb_layer_norm.weight" in keys
    assert not any(k.endswith("version") or ".q_proj." in k or k.startswith("encoder.") for k in keys)


def test_roberta_path_loads_the_published_layout(published, qa_data):
    _, model = build(qa_data, *QA_SHAPE, "--roberta-path", published)
    assert_every_weight(model, source_state(published), Dictionary.load(str(published / "dict.txt")).symbols)


def test_fairseq_checkpoint_loader_loads_the_published_layout(published, qa_data):
    """What fairseq-train --restore-file does: fairseq's loader, then a strict load_state_dict with the model cfg."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(parse(qa_data, *QA_SHAPE, "--roberta-dict", published / "dict.txt"))
    _, model = build(qa_data, *QA_SHAPE, "--roberta-dict", published / "dict.txt")
    before = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("qa_heads.")}
    state = checkpoint_utils.load_checkpoint_to_cpu(str(published / "model.pt"))
    model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    assert_every_weight(model, source_state(published), Dictionary.load(str(published / "dict.txt")).symbols)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # the QA heads stay as built


@pytest.mark.e2e
def test_a_trained_checkpoint_loads_without_the_pretrained_file(published, qa_data, tmp_path):
    """fairseq-train initialises from --roberta-path (the published layout); once that file is gone, the QA
    checkpoint still loads on its own, in-process and through fairseq-validate, with the weights it saved."""
    roberta = tmp_path / "roberta"
    roberta.mkdir()
    for name in ("model.pt", "dict.txt"):
        (roberta / name).write_bytes((published / name).read_bytes())
    save_dir = tmp_path / "ckpt"
    train = [
        "--user-dir", PACKAGE, "--task", "clusterformer_qa", "--arch", "clusterformer_qa_tiny", *QA_SHAPE,
        "--criterion", "clusterformer_qa", "--max-question-tokens", "40", "--roberta-path", roberta,
        "--optimizer", "adam", "--lr", "1e-3", "--max-update", "2", "--batch-size", "2", "--kmeans-backend", "torch",
        "--memory-size", "100", "--save-dir", save_dir, "--no-epoch-checkpoints", "--cpu", "--num-workers", "0",
    ]  # fmt: skip
    out = run_ok("fairseq-train", qa_data, *train)
    assert "pretrained RoBERTa weights loaded" in out
    checkpoint = save_dir / "checkpoint_last.pt"
    (roberta / "model.pt").unlink()
    (roberta / "dict.txt").unlink()

    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    assert cfg.model.roberta_path == str(roberta)  # still named in the saved config, and never read
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]
    loaded = models[0].state_dict()
    assert set(loaded) == set(saved)
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key
    validate = ["--user-dir", PACKAGE, "--task", "clusterformer_qa", "--path", checkpoint, "--batch-size", "2", "--cpu"]
    validated = run_ok("fairseq-validate", qa_data, *validate)
    assert re.search(r"valid on 'valid' subset.*\| em [0-9.]+", validated), validated[-2000:]
