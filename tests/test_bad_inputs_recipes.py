"""Bad input to the shell recipes, run for real: a flag without its value, an unknown flag, a value or environment
variable that is not a whole number (or UPDATES=0) and an empty value for a folder flag stop every recipe
(examples/recipe_args.sh, which they share) with exit status 2 and a line naming the flag or variable, before any work
starts; examples/qa/cpu_pretrained.sh refuses an --out made from another encoder than --hf; a checkpoint the resuming
recipes cannot read names the run. Each case checks that no file was created or changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import run_ok
from tests.hf_sources import make_bert, make_roberta
from tests.recipe_runs import EXAMPLES, mark_as_made_by, recipe, snapshot, truncated_checkpoint

SQUAD = EXAMPLES / "data" / "squad"
# recipe, a flag of it that takes a value, and for those that stop on a missing positional argument first, those
RECIPES = [
    ("qa/cpu_pretrained.sh", "--out", ()),
    ("qa/cpu_recipe.sh", "--out", ()),
    ("qa/prepare_squad.sh", "--split-dev", ()),
    ("qa/prepare_quasart.sh", "--contexts", ()),
    ("qa/prepare_nq.sh", "--bpe-dir", ()),
    ("qa/prepare_searchqa.sh", "--data", ()),
    ("code/prepare.sh", "--out", ()),
    ("code/compare.sh", "--work", ()),
    ("longrange/prepare.sh", "--out", ()),
    ("wikitext103/prepare.sh", "--dest", ()),
    ("enwik8/prepare.sh", "--workers", ()),
    ("wikitext103/train.sh", "--preset", ()),
    ("enwik8/eval.sh", "--preset", ("model.pt",)),
]


def refused(name: str, *args, cwd: Path, **env) -> str:
    """The message of a recipe that must stop with status 2, having written nothing under ``cwd``."""
    before = snapshot(cwd)
    code, out = recipe(name, *args, cwd=cwd, **env)
    assert code == 2, f"{name} exited {code}:\n{out[-3000:]}"
    assert snapshot(cwd) == before, f"{name} wrote files:\n{out[-3000:]}"
    assert "unbound variable" not in out and "Traceback" not in out and "syntax error" not in out, out
    return out


@pytest.mark.parametrize("name, flag, positional", RECIPES)
def test_a_flag_without_its_value_is_named(tmp_path, name, flag, positional):
    assert f"{flag} needs a value" in refused(name, *positional, flag, cwd=tmp_path)
    # followed by another flag, which it would otherwise have taken as its value
    out = refused(name, *positional, flag, "--help", cwd=tmp_path)
    assert f"{flag} needs a value (got the flag --help)" in out


@pytest.mark.parametrize("name, flag, positional", RECIPES)
def test_an_unknown_flag_is_named_with_the_flags_the_recipe_takes(tmp_path, name, flag, positional):
    out = refused(name, *positional, "--wrk", "x", cwd=tmp_path)
    assert "unknown flag --wrk (it takes " in out and f"{flag} " in out


@pytest.mark.parametrize("name, flag, positional", RECIPES)
def test_help_still_explains_the_recipe(tmp_path, name, flag, positional):
    code, out = recipe(name, "--help", cwd=tmp_path)
    assert code == 0 and flag in out, out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name, flag",
    [
        ("qa/cpu_pretrained.sh", "--out"),
        ("qa/cpu_pretrained.sh", "--data"),
        ("code/prepare.sh", "--out"),  # it was --out /text, and rm -rf /data-bin
        ("code/prepare.sh", "--data"),  # it was the installed packages, without a word
        ("longrange/prepare.sh", "--out"),
        ("wikitext103/prepare.sh", "--dest"),
    ],
)
def test_an_empty_folder_flag_is_refused(tmp_path, name, flag):
    assert f"{flag}: expected a folder, got an empty value" in refused(name, flag, "", cwd=tmp_path)


@pytest.mark.parametrize(
    "name, args, shown",
    [
        ("enwik8/prepare.sh", ("--data", ".", "--workers", "2x"), "--workers 2x"),
        ("enwik8/prepare.sh", ("--data", ".", "--valid-bytes", "5M"), "--valid-bytes 5M"),
        ("qa/prepare_squad.sh", ("--split-dev", "4o", "--out", "o"), "--split-dev 4o"),
        ("qa/prepare_nq.sh", ("--spm-vocab", "8k", "--out", "o"), "--spm-vocab 8k"),
    ],
)
def test_a_flag_that_is_not_a_whole_number_is_named(tmp_path, name, args, shown):
    assert f"{shown}: expected a whole number" in refused(name, *args, cwd=tmp_path)


@pytest.fixture
def fake_hf(tmp_path):
    """A folder that passes cpu_pretrained.sh's --hf check (it holds a config.json): the recipe must stop before
    the import would read it."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    return hf


@pytest.mark.parametrize(
    "name, args, variable",
    [
        ("qa/cpu_pretrained.sh", ("--hf", "hf", "--out", "out"), "UPDATES=3k"),  # the run, not a dry run
        ("qa/cpu_pretrained.sh", ("--hf", "hf", "--out", "out", "--dry-run"), "CLUSTERS=64c"),
        ("qa/cpu_pretrained.sh", ("--hf", "hf", "--out", "out"), "MAX_HOURS=two"),
        ("qa/cpu_recipe.sh", ("--out", "out", "--dry-run"), "SEEDS=1 x"),
        ("code/compare.sh", ("--work", "work", "none-s1"), "UPDATES=3k"),
        ("wikitext103/train.sh", ("--dry-run", "data"), "BATCH=16x"),
        ("enwik8/eval.sh", ("--dry-run", "model.pt"), "MAX_TOKENS=1e4"),
        ("longrange/train.sh", ("none", "1", "data", "save"), "WINDOW=8x"),
        ("qa/eval.sh", ("data", "model.pt"), "BATCH=4,"),
        ("demo.sh", (), "UPDATES=3k"),
        # 0 is fairseq's "no limit": the demo would train on, cpu_pretrained.sh plan to score a checkpoint never made
        ("demo.sh", (), "UPDATES=0"),
        ("qa/cpu_pretrained.sh", ("--hf", "hf", "--out", "out", "--dry-run"), "UPDATES=0"),
    ],
)
def test_an_environment_variable_that_is_not_a_number_is_named_first(tmp_path, fake_hf, name, args, variable):
    key, value = variable.split("=", 1)
    env = {key: value, "WORK": str(tmp_path / "demo-work"), "GPUS": "0"}
    assert f"{variable}: expected " in refused(name, *args, cwd=tmp_path, **env)


def test_a_qa_train_variable_that_is_not_a_whole_number_is_named(tmp_path):
    data = tmp_path / "bin"
    data.mkdir()
    (data / "dict.txt").write_text("a 1\n")
    (data / "qa_config.json").write_text("{}")
    out = refused("qa/train.sh", data, "--small", cwd=tmp_path, BATCH="16x")
    assert "BATCH=16x: expected a whole number" in out


def test_a_whole_number_with_a_leading_zero_is_not_read_as_octal(tmp_path, fake_hf):
    args = ("--hf", fake_hf, "--data", SQUAD, "--out", "out", "--dry-run")
    code, out = recipe("qa/cpu_pretrained.sh", *args, cwd=tmp_path, UPDATES="090")
    assert code == 0 and "UPDATES=90 " in out and "WARMUP=9 " in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # a dry run writes nothing


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    """Two Hugging Face encoders (a BERT, a RoBERTa), a copy of the BERT elsewhere, and an --out into which the
    BERT was imported by the real fairseq-clusterformer-import-hf."""
    root = tmp_path_factory.mktemp("encoders")
    (root / "a").mkdir()
    (root / "b").mkdir()
    bert, roberta = make_bert(root / "a"), make_roberta(root / "b")
    moved = shutil.copytree(bert, root / "moved")
    out = root / "out"
    run_ok("fairseq-clusterformer-import-hf", bert, out / "encoder")
    mark_as_made_by(out, "qa/cpu_pretrained.sh")
    return bert, roberta, moved, out


def test_cpu_pretrained_refuses_an_out_holding_another_encoders_import(encoders):
    bert, roberta, moved, out = encoders
    for dry in (("--dry-run",), ()):
        msg = refused("qa/cpu_pretrained.sh", "--hf", roberta, "--data", SQUAD, "--out", out, *dry, cwd=out)
        assert f"--hf {roberta}: --out {out} already holds an encoder imported from {bert}" in msg
        assert "other weights" in msg and f"or --hf {bert} to go on" in msg
    # the same weights in another folder (a rebuilt environment) are the same model: the import is reused
    before = snapshot(out)
    # (the long-range layers of this 2-layer encoder: the default 5,6 is refused as the run would refuse it)
    code, text = recipe("qa/cpu_pretrained.sh", "--hf", moved, "--data", SQUAD, "--out", out, "--dry-run", cwd=out,
                        LONG_RANGE_LAYERS="2")  # fmt: skip
    assert code == 0 and "import-hf" not in text and "prepare_squad.sh" in text, text
    assert snapshot(out) == before


def test_cpu_pretrained_refuses_data_made_from_another_encoder(encoders, tmp_path):
    bert, _, _, made = encoders
    out = tmp_path / "out"
    shutil.copytree(made / "encoder", out / "encoder")
    mark_as_made_by(out, "qa/cpu_pretrained.sh")
    squad = out / "squad_paragraph"
    squad.mkdir()
    other = {"source": "/elsewhere/minilm", "weights_file": "model.safetensors", "weights_sha256": "0" * 64}
    (squad / "encoder_source.json").write_text(str(other).replace("'", '"'))
    msg = refused("qa/cpu_pretrained.sh", "--hf", bert, "--data", SQUAD, "--out", out, cwd=out)
    assert f"{squad} was made from the encoder imported from /elsewhere/minilm" in msg
    assert f"remove {squad} to make it again" in msg


def test_cpu_pretrained_names_the_run_whose_checkpoint_cannot_be_read(tmp_path, fake_hf):
    last = truncated_checkpoint(tmp_path / "out" / "paragraph_none_seed1" / "checkpoint_last.pt")
    mark_as_made_by(tmp_path / "out", "qa/cpu_pretrained.sh")
    args = ("--hf", fake_hf, "--data", SQUAD, "--out", "out", "--dry-run")
    # float32: the run's name, not this machine's precision, is under test
    msg = refused("qa/cpu_pretrained.sh", *args, cwd=tmp_path, PRECISION="fp32")
    assert f"run paragraph_none_seed1: cannot tell how far it got from out/paragraph_none_seed1/{last.name}" in msg
    assert "cannot be read as a checkpoint" in msg
