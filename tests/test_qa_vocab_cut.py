"""cut_vocab: an imported encoder cut to the tokens of its binarised data computes, on that data, exactly what the
uncut one computes (float16 storage: exactly what the uncut one with float16-rounded weights computes, and the
float32 model's logits up to that rounding); the re-indexed data holds the same symbols."""

import argparse
import subprocess
import sys

import pytest
import torch
from fairseq.data import Dictionary

from benchmarks.qa_device.cut_vocab import data_arg
from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit
from fairseq_clusterformer.qa.pretrained import EMBED_KEY
from tests.conftest import REPO, run_ok, subprocess_env
from tests.test_qa_model import batch, build
from tests.test_qa_pretrained_recipe import small_squad, tiny_bert

QA_FLAGS = ["--window-size", "48", "--window-stride", "40", "--long-range-layers", "5,6", "--num-clusters", "4"]


ENV = subprocess_env()


def cut_vocab(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks.qa_device.cut_vocab", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A tiny BERT imported, three SQuAD articles binarised whole through its tokenizer, and the cut of both."""
    root = tmp_path_factory.mktemp("cut")
    data, _ = small_squad(root)
    run_ok("fairseq-clusterformer-import-hf", tiny_bert(root), root / "encoder")
    subprocess.run(["bash", REPO / "examples/qa/prepare_squad.sh", "--data", data, "--split-dev", "2",
                    "--contexts", "article", "--hf-dir", root / "encoder", "--out", root / "article"],
                   check=True, capture_output=True, cwd=REPO, env=ENV, timeout=300)  # fmt: skip
    for name, half in (("cut32", []), ("cut16", ["--half"])):
        proc = cut_vocab("--encoder", root / "encoder", "--data", f"squad={root / 'article/bin'}", "--out", root / name,
                         *half)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def model_on(data, encoder, kind):
    return build(data, "--roberta-path", encoder, "--long-range-layer", kind, *QA_FLAGS, arch="clusterformer_qa_base")


def take_new_parameters(cut_model, cut_dict, model, dictionary):
    """Give the cut model the uncut one's parameters that no pretrained model has (QA heads, centroids, the
    paragraph symbol's row): fairseq draws them at random after the embedding matrix, whose size differs."""
    ours, theirs = cut_model.state_dict(), model.state_dict()
    with torch.no_grad():
        ours[EMBED_KEY][cut_dict.index("<p>")] = theirs[EMBED_KEY][dictionary.index("<p>")]
        for name in ours:
            if is_new(name):
                ours[name].copy_(theirs[name])


def is_new(name: str) -> bool:
    return name.startswith("qa_heads.") or name.endswith(".centroids")


def rounded_to_half(model, dictionary):
    """The model's state with every pretrained weight rounded through float16 (not the paragraph row)."""
    state = {
        k: v.half().float() if v.is_floating_point() and not is_new(k) else v for k, v in model.state_dict().items()
    }
    paragraph = dictionary.index("<p>")
    state[EMBED_KEY][paragraph] = model.state_dict()[EMBED_KEY][paragraph]
    return state


def logits(task, model):
    task.load_dataset("valid")
    out = model(**batch(task, "valid", list(range(len(task.dataset("valid")))))["net_input"])
    return torch.cat([out["start"], out["end"]])


def test_the_cut_keeps_the_symbols_and_only_the_rows_the_data_uses(imported):
    full = Dictionary.load(str(imported / "article/bin/dict.txt"))
    cut = Dictionary.load(str(imported / "cut32/squad/dict.txt"))
    assert len(cut) < len(full) - 99  # the tokenizer's 99 [unusedN] tokens, at least, never occur
    for split in ("train", "valid"):
        before, after = (
            QABinarizedSplit(str(imported / "article/bin"), split),
            QABinarizedSplit(str(imported / "cut32/squad"), split),
        )
        assert len(before) == len(after) and before.metas == after.metas
        for i in range(len(before)):
            for old, new in ((before[i].question, after[i].question), (before[i].context, after[i].context)):
                assert [full[t] for t in old.tolist()] == [cut[t] for t in new.tolist()]
    encoder = torch.load(imported / "cut16/encoder/model.pt", weights_only=True)["model"]
    assert encoder[EMBED_KEY].dtype == torch.float16 and encoder[EMBED_KEY].size(0) == len(cut)  # <p> out, <mask> in


@pytest.mark.parametrize("kind", ["none", "cluster"])
def test_the_cut_model_computes_the_uncut_models_logits(imported, kind):
    task, model = model_on(imported / "article/bin", imported / "encoder", kind)
    full = task.source_dictionary
    for name in ("cut32", "cut16"):
        cut_task, cut_model = model_on(imported / name / "squad", imported / name / "encoder", kind)
        take_new_parameters(cut_model, cut_task.source_dictionary, model, full)
        with torch.no_grad():
            ours, theirs = logits(cut_task, cut_model), logits(task, model)
        if name == "cut32":
            assert torch.equal(ours, theirs)
            continue
        # float16 storage: the uncut model with its pretrained weights rounded the same way gives the same logits
        model16 = model_on(imported / "article/bin", imported / "encoder", kind)[1]
        model16.load_state_dict(rounded_to_half(model, full))
        with torch.no_grad():
            assert torch.equal(ours, logits(task, model16))
        assert ours.sub(theirs).abs().max() <= 1e-2 * theirs.abs().max()
        assert not torch.equal(ours, theirs)


def test_bad_input_names_the_flag(imported, tmp_path):
    proc = cut_vocab("--encoder", tmp_path, "--data", f"squad={imported / 'article/bin'}", "--out", tmp_path / "o")
    assert proc.returncode == 1 and "--encoder" in proc.stderr and "model.pt not found" in proc.stderr
    assert not (tmp_path / "o").exists()
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=DIR"):
        data_arg(str(imported / "article/bin"))


PREPARED = REPO / "data-bin/qa/device"  # benchmarks/qa_device/prepare.sh's WORK and OUT, where they were made
PAYLOAD = REPO / ".qa-device"


@pytest.mark.skipif(not (PREPARED / "cut").is_dir() or not PAYLOAD.is_dir(), reason="no prepared device payload here")
@pytest.mark.parametrize("kind", ["none", "cluster"])
def test_the_prepared_payload_computes_the_uncut_minilm_logits(kind):
    """benchmarks/qa_device/prepare.sh's real payload (all-MiniLM-L6-v2 cut to 18k rows, float16) on three
    held-out whole articles: exactly the uncut import with float16-rounded weights; against the float32 import,
    the window-only model moves by float16's rounding, while rounding moves some tokens of a Cluster-Former layer
    (random initial centroids) into other clusters. Run with -s for the figures."""
    flags = ["--window-size", "256", "--window-stride", "224", "--max-context-eval", "12000", "--long-range-layer",
             kind, "--long-range-layers", "5,6"]  # fmt: skip
    uncut = [PREPARED / "recipe/squad_article/bin", "--roberta-path", PREPARED / "recipe/encoder", *flags]
    task, model = build(*uncut, arch="clusterformer_qa_base")
    model16 = build(*uncut, arch="clusterformer_qa_base")[1]
    model16.load_state_dict(rounded_to_half(model, task.source_dictionary))
    cut_task, cut = build(PREPARED / "cut/squad_article", "--roberta-path", PAYLOAD / "encoder", *flags,
                          arch="clusterformer_qa_base")  # fmt: skip
    take_new_parameters(cut, cut_task.source_dictionary, model, task.source_dictionary)
    for index in (0, 700, 1588):
        with torch.no_grad():
            ours = torch.cat(list(cut(**batch(cut_task, "valid", [index])["net_input"]).values()))
            rounded = torch.cat(list(model16(**batch(task, "valid", [index])["net_input"]).values()))
            theirs = torch.cat(list(model(**batch(task, "valid", [index])["net_input"]).values()))
        assert torch.equal(ours, rounded)
        print(f"{kind} question {index}: max |cut float16 - uncut float32| {ours.sub(theirs).abs().max():.2e} of "
              f"max |logit| {theirs.abs().max():.2f}")  # fmt: skip
        if kind == "none":
            assert ours.sub(theirs).abs().max() <= 1e-2 * theirs.abs().max()
