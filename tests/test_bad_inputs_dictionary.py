"""A dictionary other than the training run's, of the same size, is refused on every path that loads a language
model: docs/usage.md's ``fairseq-eval-lm`` without ``--task``, ``fairseq-clusterformer-causal-eval``, and a model built
in Python. Checkpoints from before the dictionary was recorded still load, with one warning."""

import logging

import pytest
import torch
from fairseq.data import Dictionary
from torch import nn

from fairseq_clusterformer.checkpoints import dictionary as dictionary_fingerprint
from fairseq_clusterformer.checkpoints.dictionary import BUFFER, check_dictionary, record_dictionary
from tests.conftest import PACKAGE, SLICE, TINY_LM_TRAIN, run_cli, run_ok

WORDS = ["the", "of", "and", "in"]


def recorded(words: list[str], source: str = "data-bin/dict.txt") -> nn.Module:
    dictionary = Dictionary()
    for word in words:
        dictionary.add_symbol(word)
    model = nn.Module()
    record_dictionary(model, dictionary, source)
    return model


def test_the_same_dictionary_loads():
    state = recorded(WORDS).state_dict()
    check_dictionary(recorded(WORDS), state)


def test_a_reordered_dictionary_names_its_file_line_and_symbol():
    state = recorded(WORDS).state_dict()
    with pytest.raises(ValueError, match=r"than other/dict.txt .*symbol 5 \('and', line 2 of other/dict.txt\)"):
        check_dictionary(recorded(["the", "and", "of", "in"], "other/dict.txt"), state)


def test_a_dictionary_with_an_extra_symbol_at_the_end_is_refused():
    state = recorded(WORDS).state_dict()
    with pytest.raises(ValueError, match=r"\(8 symbols in training, 9 here\).*symbol 8 \('to', line 5 of"):
        check_dictionary(recorded([*WORDS, "to"]), state)
    with pytest.raises(ValueError, match=r"symbol 7, which data-bin/dict.txt does not have"):
        check_dictionary(recorded(WORDS[:3]), state)


def test_weights_without_a_recorded_dictionary_load_with_one_warning(caplog, monkeypatch):
    monkeypatch.setattr(dictionary_fingerprint, "_warned_unrecorded", False)
    model = recorded(WORDS)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            state = {}
            check_dictionary(model, state)
            assert torch.equal(state[BUFFER], getattr(model, BUFFER))  # a strict load finds the key
    assert caplog.text.count("does not record its training dictionary") == 1


@pytest.fixture(scope="module")
def trained(lm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("dictionary-ckpt")
    run_ok(
        "fairseq-train", lm_data, *TINY_LM_TRAIN, "--save-dir", save, "--max-update", 2, "--no-epoch-checkpoints",
        "--disable-validation", "--memory-size", 1000,
    )  # fmt: skip
    return save / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def reordered(lm_data, tmp_path_factory):
    """The test split binarised with the training dict.txt's lines 3 and 4 swapped (same size, other token ids)."""
    folder = tmp_path_factory.mktemp("reordered")
    lines = (lm_data / "dict.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2], lines[3] = lines[3], lines[2]
    (folder / "dict.txt").write_text("".join(lines), encoding="utf-8")
    (folder / "test.txt").write_text(
        "".join((SLICE / "test.txt").read_text(encoding="utf-8").splitlines(keepends=True)[:12]), encoding="utf-8"
    )
    dest = folder / "data-bin"
    run_ok(
        "fairseq-preprocess", "--only-source", "--srcdict", folder / "dict.txt", "--testpref", folder / "test.txt",
        "--destdir", dest, "--workers", 1,
    )  # fmt: skip
    return dest, lines[2].split()[0]


EVAL = ["--tokens-per-sample", 200, "--batch-size", 4, "--num-workers", 0]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "tool, extra", [("fairseq-eval-lm", []), ("fairseq-clusterformer-causal-eval", ["--max-blocks", 2])]
)
def test_evaluating_with_a_reordered_dictionary_fails_naming_it(tool, extra, trained, reordered):
    """docs/usage.md's command and causal-eval, both without --task: the task's own check never runs there."""
    data, first = reordered
    code, out = run_cli(tool, data, "--user-dir", PACKAGE, "--path", trained, *EVAL, "--gen-subset", "test", *extra)
    assert code != 0, out[-3000:]
    assert f"another dictionary than {data / 'dict.txt'}" in out, out[-3000:]
    assert f"symbol 6 ('{first}', line 3 of {data / 'dict.txt'})" in out


@pytest.mark.e2e
def test_a_checkpoint_without_a_recorded_dictionary_still_evaluates(trained, lm_data, tmp_path):
    state = torch.load(trained, map_location="cpu", weights_only=False)
    del state["model"][BUFFER]
    old = tmp_path / "old.pt"
    torch.save(state, old)
    out = run_ok("fairseq-eval-lm", lm_data, "--user-dir", PACKAGE, "--path", old, *EVAL, "--gen-subset", "test")
    assert out.count("does not record its training dictionary") == 1
    assert "Perplexity" in out
