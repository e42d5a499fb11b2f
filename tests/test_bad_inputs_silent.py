"""Cases the console commands used to pass over without a word, or end in a raw error far from the cause: each now
names the flag or the checkpoint, through the real fairseq-train and fairseq-eval-lm."""

import pytest
import torch

from tests.conftest import PACKAGE, SLICE, TINY_LM_TRAIN, run_cli, run_ok

pytestmark = pytest.mark.e2e

SHORT = ["--max-update", "2", "--no-epoch-checkpoints", "--memory-size", "1000", "--seed", "3"]


@pytest.fixture(scope="module")
def trained(lm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("silent")
    run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, *SHORT, "--save-dir", save)
    return save / "checkpoint_last.pt"


def last_line(out: str) -> str:
    return out.strip().splitlines()[-1]


@pytest.mark.parametrize("tokens", ["0", "-8"])
def test_a_sample_of_no_tokens_is_refused_naming_the_flag(lm_data, tmp_path, tokens):
    args = [a if a != "200" else tokens for a in TINY_LM_TRAIN]  # TINY_LM_TRAIN's --tokens-per-sample 200
    code, out = run_cli("fairseq-train", lm_data, *args, *SHORT, "--save-dir", tmp_path / "save")
    assert code != 0
    assert f"--tokens-per-sample must be a positive number of tokens, got {tokens}" in last_line(out), out[-2000:]
    assert not list((tmp_path / "save").glob("*.pt"))


def test_a_window_as_long_as_the_sample_is_named_with_both_flags(lm_data, tmp_path):
    out = run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, *SHORT, "--save-dir", tmp_path, "--window-size", "512")
    assert "--window-size 512 is not below --tokens-per-sample 200" in out, out[-3000:]
    assert "long-range layers (--long-range-layer cluster) see nothing the sliding windows do not" in out


def test_a_dense_baseline_window_says_nothing(lm_data, tmp_path):
    out = run_ok(
        "fairseq-train", lm_data, *TINY_LM_TRAIN, *SHORT, "--save-dir", tmp_path, "--window-size", "512",
        "--long-range-layer", "none",
    )  # fmt: skip
    assert "is not below --tokens-per-sample" not in out


def test_finetuning_on_another_dictionary_ends_on_the_dictionary_message(trained, tmp_path):
    other = tmp_path / "other-bin"
    run_ok(
        "fairseq-preprocess", "--only-source", "--trainpref", SLICE / "train.txt",
        "--validpref", SLICE / "valid.txt", "--destdir", other,
        "--nwordssrc", "300", "--workers", "1",
    )  # fmt: skip
    code, out = run_cli(
        "fairseq-train", other, *TINY_LM_TRAIN, *SHORT, "--save-dir", tmp_path / "save",
        "--finetune-from-model", trained,
    )  # fmt: skip
    assert code != 0
    line = last_line(out)
    assert f"--finetune-from-model {trained} was trained with another dictionary than {other}/dict.txt" in line, line
    assert "ensure that the architectures match" not in out


def legacy_copy_with_flipped_bytes(src, dst) -> None:
    """``src`` saved again in torch.save's legacy (non-zip) format, then 16 bytes of the embedding's raw storage in
    the file overwritten with 0xFF (a NaN bit pattern), as a damaged disk or copy would."""
    state = torch.load(src, map_location="cpu", weights_only=False)
    torch.save(state, dst, _use_new_zipfile_serialization=False)
    weight = state["model"]["decoder.embed_tokens.weight"]
    data = bytearray(dst.read_bytes())
    at = data.find(weight.contiguous().numpy().tobytes()[:64])
    assert at > 0, "the embedding's bytes are not in the legacy file"
    data[at : at + 16] = b"\xff" * 16
    dst.write_bytes(bytes(data))


def test_a_legacy_checkpoint_with_flipped_bytes_is_not_scored_as_inf(trained, lm_data, tmp_path):
    damaged = tmp_path / "legacy.pt"
    legacy_copy_with_flipped_bytes(trained, damaged)
    before = damaged.read_bytes()
    code, out = run_cli(
        "fairseq-eval-lm", lm_data, "--path", damaged, "--user-dir", PACKAGE, "--tokens-per-sample", "200",
        "--batch-size", "4", "--num-workers", "0", "--gen-subset", "valid",
    )  # fmt: skip
    assert f"--path {damaged} is in torch.save's legacy (non-zip) format" in out, out[-3000:]
    assert "its integrity cannot be checked" in out
    assert code != 0 and "Perplexity" not in out, out[-3000:]
    assert f"--path {damaged}: the model's log-probabilities are not finite" in last_line(out), last_line(out)
    assert damaged.read_bytes() == before


def test_an_intact_legacy_checkpoint_scores_with_the_warning(trained, lm_data, tmp_path):
    legacy = tmp_path / "legacy.pt"
    torch.save(
        torch.load(trained, map_location="cpu", weights_only=False), legacy, _use_new_zipfile_serialization=False
    )
    out = run_ok(
        "fairseq-eval-lm", lm_data, "--path", legacy, "--user-dir", PACKAGE, "--tokens-per-sample", "200",
        "--batch-size", "4", "--num-workers", "0", "--gen-subset", "valid",
    )  # fmt: skip
    assert "its integrity cannot be checked" in out and "Perplexity" in out


def test_finite_log_probabilities_whose_perplexity_overflows_are_not_printed_as_inf(trained, lm_data, tmp_path):
    # a damaged weight that stays finite: the output embedding 10,000 times too large gives finite log-probabilities
    # and a loss of thousands of bits a token, whose 2**loss fairseq computes in float32 (inf)
    state = torch.load(trained, map_location="cpu", weights_only=False)
    state["model"]["decoder.embed_tokens.weight"] *= 1e4
    damaged = tmp_path / "legacy.pt"
    torch.save(state, damaged, _use_new_zipfile_serialization=False)
    code, out = run_cli(
        "fairseq-eval-lm", lm_data, "--path", damaged, "--user-dir", PACKAGE, "--tokens-per-sample", "200",
        "--batch-size", "4", "--num-workers", "0", "--gen-subset", "valid",
    )  # fmt: skip
    assert code != 0 and "Perplexity: inf" not in out, out[-3000:]
    line = last_line(out)
    assert f"--path {damaged}: the loss is " in line and "the perplexity 2**loss is inf" in line, line


@pytest.mark.parametrize("first, then", [(["--autocast-bf16"], []), ([], ["--autocast-bf16"])])
def test_a_resume_in_another_precision_says_so(lm_data, tmp_path, first, then):
    run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, *SHORT, "--save-dir", tmp_path, *first)
    out = run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, *SHORT[2:], "--max-update", "4", "--save-dir", tmp_path,
                 *then)  # fmt: skip
    trained, goes_on = ("bfloat16 layers", "float32") if first else ("float32", "bfloat16 layers")
    said = f"--restore-file {tmp_path / 'checkpoint_last.pt'} was trained in {trained}"
    assert said in out and f"this run goes on in {goes_on}" in out, out[-3000:]
    unchanged = run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, *SHORT[2:], "--max-update", "6", "--save-dir",
                       tmp_path, *then)  # fmt: skip
    assert "was trained in" not in unchanged  # the checkpoint now records the new precision
