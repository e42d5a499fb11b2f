"""Bad input to the plug-in's newer package surfaces, run through the real console scripts: the Hugging Face import
(an output that would overwrite the source, a truncated weights file), prediction into an output it cannot write,
and a checkpoint whose long-range layers have no centroids. Every case ends with a non-zero status, a message that
names the file, flag or layers at fault, and no file changed or left behind."""

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import PACKAGE, TINY_LM_TRAIN, run_cli, run_ok
from tests.hf_sources import make_bert

pytestmark = pytest.mark.e2e

IMPORT_HF = "fairseq-clusterformer-import-hf"


def snapshot(folder):
    """Every file under ``folder`` (hidden ones too) with its bytes: what must come out of a refused run unchanged."""
    return {path.relative_to(folder): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def refused(tool, *args):
    code, out = run_cli(tool, *args)
    assert code == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    return out


@pytest.fixture(scope="module")
def bert_source(tmp_path_factory):
    return make_bert(tmp_path_factory.mktemp("bert_source"))


@pytest.fixture
def source(bert_source, tmp_path):
    """A private copy of the tiny BERT directory (tokenizer.json truncating at 16: the setting an import drops)."""
    return shutil.copytree(bert_source, tmp_path / "src")


def test_an_import_into_its_own_source_is_refused_and_the_source_kept(source, tmp_path):
    before = snapshot(source)
    out = refused(IMPORT_HF, source, source)
    assert f"OUT_DIR {source} is SRC_DIR {source}" in out and "tokenizer.json" in out
    inside = source / "fairseq"
    out = refused(IMPORT_HF, source, inside)
    assert f"OUT_DIR {inside} is inside SRC_DIR {source}" in out
    # the same folder under another name
    link = tmp_path / "link"
    link.symlink_to(source)
    out = refused(IMPORT_HF, source, link)
    assert f"OUT_DIR {link} is SRC_DIR {source} ({source})" in out
    assert snapshot(source) == before  # no byte changed, no file (or hidden temporary) added
    assert not inside.exists()


def test_an_import_never_writes_over_files_it_did_not_create(source, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "tokenizer.json").write_text('{"mine": true}')
    (taken / "notes.txt").write_text("mine")
    before = snapshot(taken)
    out = refused(IMPORT_HF, source, taken)
    assert f"OUT_DIR {taken} holds tokenizer.json that no earlier import wrote (no hf_import.json of one)" in out
    assert snapshot(taken) == before

    # an earlier import's output is replaced by the new import, and files beside it are left alone
    fresh = tmp_path / "fresh"
    run_ok(IMPORT_HF, source, fresh)
    (fresh / "notes.txt").write_text("mine")
    first = snapshot(fresh)
    run_ok(IMPORT_HF, source, fresh)
    again = snapshot(fresh)
    assert again.keys() == first.keys() and again[Path("notes.txt")] == b"mine"
    assert again[Path("dict.txt")] == first[Path("dict.txt")]


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_a_truncated_weights_file_is_named(source, tmp_path, name):
    weights = source / name
    if name == "pytorch_model.bin":  # the same weights in PyTorch's format, the only weights file of the source
        torch.save(load_file(source / "model.safetensors"), weights)
        (source / "model.safetensors").unlink()
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a download cut short
    out = refused(IMPORT_HF, source, tmp_path / "out")
    assert f"{IMPORT_HF}: error: {weights}: cannot be read" in out and "truncated or corrupt" in out
    assert not (tmp_path / "out").exists()


def unwritable_folder(tmp_path):
    """A folder this user cannot write in: a read-only one of its own, or (as root, who may write anywhere that is
    mounted read-write) /proc/sys, which the kernel keeps read-only."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/proc/sys")):
        if candidate.is_dir() and not os.access(candidate, os.W_OK):
            return candidate
    pytest.skip("no folder here that this user cannot write in")


@pytest.mark.parametrize("case", ["a directory", "below a file", "in a read-only folder"])
def test_qa_predict_refuses_its_output_before_it_reads_the_checkpoint(tmp_path, case):
    (tmp_path / "notes.txt").write_text("mine")
    output, message = {
        "a directory": (tmp_path, "is a directory"),
        "below a file": (tmp_path / "notes.txt" / "pred.json", f"{tmp_path / 'notes.txt'} is a file, not a folder"),
        "in a read-only folder": (unwritable_folder(tmp_path) / "pred.json", "this user cannot write in"),
    }[case]
    before = snapshot(tmp_path)
    # the checkpoint does not exist: the output is checked first, or the error would name --path
    missing = tmp_path / "no_such_checkpoint.pt"
    data = tmp_path / "data-bin"
    out = refused("fairseq-clusterformer-qa-predict", data, "--path", missing, "--output", output, "--cpu")
    assert f"fairseq-clusterformer-qa-predict: error: --output {output}: {message}" in out
    assert str(missing) not in out
    assert snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def lm_checkpoint(lm_data, tmp_path_factory):
    """checkpoint_last.pt of the tiny Cluster-Former LM (long-range layers 2 and 4) after one update."""
    save = tmp_path_factory.mktemp("centroids") / "run"
    run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, "--memory-size", "2000", "--no-epoch-checkpoints",
           "--max-update", "1", "--save-dir", save)  # fmt: skip
    return save / "checkpoint_last.pt"


def evaluate(tool, lm_data, path, *extra):
    flags = ["--path", path, "--user-dir", PACKAGE, "--tokens-per-sample", "200", "--batch-size", "2", *extra]
    code, out = run_cli(tool, lm_data, *flags, *(["--max-blocks", "2"] if "causal" in tool else []))
    assert code != 0, out[-3000:]
    assert "Missing key(s)" not in out, out[-3000:]
    return out


def test_a_checkpoint_without_centroids_names_the_layers_that_lack_them(lm_checkpoint, lm_data, tmp_path):
    state = torch.load(lm_checkpoint, weights_only=False)
    for key in [k for k in state["model"] if k.endswith((".centroids", ".shares", ".refreshes"))]:
        del state["model"][key]
    stripped = tmp_path / "no_centroids.pt"
    torch.save(state, stripped)
    before = stripped.read_bytes()
    lacking = "no K-Means centroids for the Cluster-Former layer(s) 2, 4 of this model (decoder.layers.1.centroids, "
    # the README's plain fairseq-eval-lm: fairseq's own log line names the file it loads
    out = evaluate("fairseq-eval-lm", lm_data, stripped)
    assert lacking in out and "is not a Cluster-Former checkpoint" in out and f"loading model(s) from {stripped}" in out
    out = evaluate("fairseq-clusterformer-causal-eval", lm_data, stripped)
    assert f"--path {stripped}: the checkpoint has {lacking}" in out
    assert stripped.read_bytes() == before


def test_a_model_of_other_long_range_layers_is_named(lm_checkpoint, lm_data):
    before = lm_checkpoint.read_bytes()
    out = evaluate("fairseq-eval-lm", lm_data, lm_checkpoint, "--model-overrides", "{'long_range_layers': '1,2'}")
    assert "no K-Means centroids for the Cluster-Former layer(s) 1 of this model (decoder.layers.0.centroids)" in out
    assert "it has centroids for layer(s) 4 instead: it was trained with other --long-range-layers" in out
    assert lm_checkpoint.read_bytes() == before
