"""The WikiText-103 and enwik8 recipes: byte-level preparation, the paper's defaults, and prepare / train / eval end
to end on local files at a tiny scale (nothing is downloaded)."""

import math
import re
import shlex
import subprocess
import zipfile

import pytest
import torch
from fairseq import options

from fairseq_clusterformer.layers.kinds import long_range_choices
from fairseq_clusterformer.scripts.lm.prepare_enwik8 import STANDARD_HELD_OUT, bytes_to_text, read_bytes, split_bytes
from tests.conftest import REPO, SLICE, subprocess_env

EXAMPLES = REPO / "examples"
CHARS = REPO / "examples" / "data" / "tinyshakespeare-slice"
# the recipes' smoke preset (docs/usage.md), a little shorter still
SMOKE = {"UPDATES": "4", "NUM_WORKERS": "0", "GPUS": "0"}


def script(recipe, name, *args, **env):
    """Run examples/<recipe>/<name>.sh with the environment's tools on PATH; returns (exit code, output)."""
    full_env = subprocess_env(**env)
    proc = subprocess.run(
        ["bash", str(EXAMPLES / recipe / f"{name}.sh"), *map(str, args)],
        env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900,
    )  # fmt: skip
    return proc.returncode, proc.stdout


def script_ok(recipe, name, *args, **env):
    code, out = script(recipe, name, *args, **env)
    assert code == 0, f"{recipe}/{name}.sh failed ({code}):\n{out[-4000:]}"
    return out


def text_to_bytes(text: bytes) -> bytes:
    """Invert bytes_to_text: decimal tokens back to bytes, line breaks back to the newline byte."""
    return b"\n".join(bytes(int(token) for token in line.split()) for line in text.split(b"\n"))


def test_byte_split_is_the_standard_one_and_every_byte_is_one_token(tmp_path):
    data = bytes(range(256)) * 3 + b"\n\nend"
    parts = split_bytes(data, 100, 50)
    assert [len(parts[name]) for name in ("train", "valid", "test")] == [len(data) - 150, 100, 50]
    assert parts["train"] + parts["valid"] + parts["test"] == data
    assert parts["test"] == data[-50:]  # test is the tail, valid the stretch before it
    for part in parts.values():
        text = bytes_to_text(part)
        assert text_to_bytes(text) == part
        assert sum(len(line.split()) for line in text.split(b"\n")) == len(part) - part.count(b"\n")
    assert STANDARD_HELD_OUT == 5_000_000  # 90M / 5M / 5M for the 100M bytes of enwik8
    with pytest.raises(ValueError, match="--valid-bytes"):
        split_bytes(data, 0, 10)
    with pytest.raises(ValueError, match="no training bytes"):
        split_bytes(b"abc", 2, 1)
    archive = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("enwik8", data)
    assert read_bytes(archive) == data
    with zipfile.ZipFile(tmp_path / "two.zip", "w") as out:
        out.writestr("a", b"1")
        out.writestr("b", b"2")
    with pytest.raises(ValueError, match="--input .*two.zip"):
        read_bytes(tmp_path / "two.zip")
    with pytest.raises(FileNotFoundError, match="--input"):
        read_bytes(tmp_path / "missing")


def parse_dry_run(recipe, *flags, **env):
    """train.sh --dry-run's command, read by fairseq's own parser."""
    out = script_ok(recipe, "train", "--dry-run", *flags, **env)
    argv = shlex.split(out.strip().splitlines()[-1])
    assert argv[0] == "fairseq-train"
    return options.parse_args_and_arch(options.get_training_parser(), argv[1:])


PAPER_ARCHS = [
    ("wikitext103", "clusterformer_lm_wiki103", "adaptive_loss"),
    ("enwik8", "clusterformer_lm_enwik8", "cross_entropy"),
]


@pytest.mark.parametrize("recipe,arch,criterion", PAPER_ARCHS)
def test_train_defaults_are_the_papers(recipe, arch, criterion):
    args = parse_dry_run(recipe, GPUS="1")
    assert (args.arch, args.criterion, args.decoder_layers, args.decoder_attention_heads) == (arch, criterion, 16, 8)
    assert (args.long_range_layers, args.long_range_layer, args.num_clusters) == ("11,15", "cluster", 512)
    assert (args.tokens_per_sample, args.window_size, args.window_stride) == (3072, 256, 128)
    assert (args.optimizer, args.lr, args.clip_norm, args.warmup_updates) == ("sgd", [0.1], 0.1, 16000)
    assert (args.max_update, args.dropout, args.batch_size, args.update_freq) == (286000, 0.3, 16, [1])
    assert args.cluster_causality == "strict" and not args.fp16


def test_train_settings_follow_the_environment():
    env = dict(GPUS="8", UPDATE_FREQ="2", FP16="1", LONG_RANGE="lsh", CAUSALITY="paper", CLUSTERS="64", LR="0.05")
    args = parse_dry_run("wikitext103", **env)
    assert (args.batch_size, args.update_freq, args.distributed_world_size) == (1, [2], 8)  # 16 = 1 x 2 x 8
    assert (args.long_range_layer, args.cluster_causality, args.num_clusters, args.lr) == ("lsh", "paper", 64, [0.05])
    assert args.fp16
    small = parse_dry_run("enwik8", "--small", GPUS="0", LONG_RANGE="sparse", UPDATES="7")
    assert (small.decoder_layers, small.decoder_embed_dim, small.long_range_layers) == (6, 128, "4,6")
    assert (small.tokens_per_sample, small.window_size, small.optimizer, small.max_update) == (2048, 128, "adam", 7)
    assert small.long_range_layer == "sparse"


@pytest.mark.parametrize("precision", ["memory-efficient-fp16", "amp"])
def test_half_precision_settings_reach_fairseq(precision):
    args = parse_dry_run("enwik8", "--small", GPUS="0", PRECISION=precision)
    assert getattr(args, precision.replace("-", "_"))
    # fairseq's parser sets --fp16 along with --memory-efficient-fp16
    assert args.fp16 == (precision == "memory-efficient-fp16")


def test_bf16_is_refused_before_fairseq_turns_it_into_tpu_mode():
    # fairseq 0.12's CLI sets --tpu for --bf16, then fails with "'NoneType' object has no attribute 'xla_device'"
    code, out = script("enwik8", "train", "--dry-run", "--small", GPUS="0", BF16="1")
    assert code == 2 and "BF16=1" in out and "torch_xla" in out and "PRECISION=fp16" in out
    code, out = script("enwik8", "train", "--dry-run", "--small", GPUS="0", PRECISION="bf16")
    assert code == 2 and "PRECISION must be" in out


@pytest.mark.parametrize("recipe", ["wikitext103", "enwik8"])
def test_scripts_explain_themselves_and_name_what_is_wrong(recipe, tmp_path):
    for name in ("prepare", "train", "eval"):
        code, out = script(recipe, name, "-h")
        assert code == 0 and out.startswith("usage: examples/")
    # no list of kinds in the recipe: fairseq-train's --long-range-layer refuses it, naming the value and the kinds
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dict.txt").touch()
    code, out = script(recipe, "train", tmp_path / "data", LONG_RANGE="bogus", GPUS="0")
    assert code == 2 and "argument --long-range-layer: invalid choice: 'bogus'" in out
    assert all(f"'{kind}'" in out for kind in long_range_choices())
    code, out = script(recipe, "train", "--dry-run", GPUS="2", BATCH="15")
    assert code == 2 and "BATCH (15)" in out
    code, out = script(recipe, "train", tmp_path / "nodata", GPUS="0")
    assert code == 2 and f"{tmp_path}/nodata/dict.txt not found" in out
    code, out = script(recipe, "prepare", "--data", tmp_path / "nowhere")
    assert code == 2 and "--data" in out and "nowhere" in out
    code, out = script(recipe, "prepare", "--data", tmp_path)  # a folder without the expected files
    assert code == 2 and ("wiki.train.tokens" in out if recipe == "wikitext103" else "enwik8" in out)
    code, out = script(recipe, "prepare", "--bogus")
    assert code == 2 and "unknown flag --bogus" in out
    code, out = script(recipe, "eval", tmp_path / "missing.pt")
    assert code == 2 and "missing.pt not found" in out


def trained_config(checkpoint):
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["cfg"]["model"]


@pytest.mark.e2e
def test_wikitext103_recipe_runs_end_to_end_on_local_files(tmp_path):
    data_bin = tmp_path / "data-bin"
    out = script_ok("wikitext103", "prepare", "--data", SLICE, "--dest", data_bin, "--workers", "1")
    assert re.search(r"train.txt: 1221 sents, 59788 tokens", out), out
    save = tmp_path / "ckpt"
    script_ok("wikitext103", "train", "--preset", "smoke", data_bin, SAVE_DIR=str(save), CAUSALITY="paper", **SMOKE)
    model = trained_config(save / "checkpoint_last.pt")
    assert (model["decoder_layers"], model["decoder_embed_dim"], model["tokens_per_sample"]) == (4, 32, 128)
    assert (model["long_range_layer"], model["cluster_causality"], model["num_clusters"]) == ("cluster", "paper", 16)
    log = tmp_path / "eval.log"
    out = script_ok("wikitext103", "eval", "--preset", "smoke", save / "checkpoint_last.pt", data_bin, LOG=str(log))
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"perplexity: [\d.]+", last), out
    loss = float(re.search(r"Loss \(base 2\): ([\d.]+)", log.read_text()).group(1))
    assert float(last.split()[1]) == pytest.approx(2**loss, rel=1e-3)
    vocab = sum(1 for _ in open(data_bin / "dict.txt")) + 4
    assert 1 < float(last.split()[1]) < 2 * vocab


@pytest.mark.e2e
def test_enwik8_recipe_runs_end_to_end_on_local_bytes(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    data = b"".join((CHARS / f"{split}.txt").read_bytes() for split in ("train", "valid", "test"))
    (raw / "enwik8").write_bytes(data)
    data_bin = tmp_path / "data-bin"
    out = script_ok("enwik8", "prepare", "--data", raw, "--dest", data_bin, "--valid-bytes", "5000", "--test-bytes",
                    "5000", "--workers", "1")  # fmt: skip
    parts = split_bytes(data, 5000, 5000)
    for split, part in parts.items():  # one token per byte (a last line without a line break gets its own end token)
        tokens = len(part) + (0 if part.endswith(b"\n") else 1)
        assert re.search(rf"{split}.txt: \d+ sents, {tokens} tokens, 0.0% replaced", out), out
    save = tmp_path / "ckpt"
    script_ok("enwik8", "train", "--preset", "smoke", data_bin, SAVE_DIR=str(save), LONG_RANGE="none", **SMOKE)
    assert trained_config(save / "checkpoint_last.pt")["long_range_layer"] == "none"
    log = tmp_path / "eval.log"
    out = script_ok("enwik8", "eval", "--preset", "smoke", save / "checkpoint_last.pt", data_bin, LOG=str(log))
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"bpc: [\d.]+", last), out
    bpc = float(last.split()[1])
    assert bpc == float(re.search(r"Loss \(base 2\): ([\d.]+)", log.read_text()).group(1))
    symbols = sum(1 for _ in open(data_bin / "dict.txt")) + 4
    assert 0 < bpc < math.log2(symbols) + 1
