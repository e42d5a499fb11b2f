"""One source for the LM presets: examples/{wikitext103,enwik8}/{train,eval}.sh run exactly what presets.py
says (the settings compare.sh runs), the small preset is the one the measured tables ran, the paper preset
describes its named architectures truthfully, docs/usage.md's table shows what the file defines, and the renamed
preset's old name still runs."""

import re
import shlex
import subprocess
import sys

import pytest
from fairseq import options

from fairseq_clusterformer.scripts.lm import presets
from fairseq_clusterformer.scripts.lm.presets import PRESETS, recipe_row, train_args
from tests.conftest import PACKAGE, REPO
from tests.test_recipes import parse_dry_run, script, script_ok

RECIPES = {"wikitext103": "word", "enwik8": "char"}
CASES = [(preset, recipe) for preset in sorted(PRESETS) for recipe in RECIPES]
# how a run is driven, not what it trains: the comparison validates and saves once at the end into its own folders
RUN_CONTROL = {"data", "save_dir", "num_workers", "validate_interval", "save_interval", "no_epoch_checkpoints"}
MEASURED = REPO / "benchmarks" / "results" / "compare-small-seeds" / "results.md"
USAGE = REPO / "docs" / "usage.md"
# docs/usage.md's table of the presets: its columns, and what each of its rows shows of a preset (every setting but
# the log interval, and whether the dimensions are passed or left to the named architecture)
TABLE_COLUMNS = {"`smoke`": ("smoke", "word")}
TABLE_COLUMNS.update({f"`{p}`, {level}": (p, level) for p in ("small", "paper") for level in ("word", "char")})
TABLE_ROWS = {
    "`--arch`": lambda s: f"`{s.arch}`",
    "layers; dims / FFN / heads": lambda s: f"{s.layers}; {s.embed_dim} / {s.ffn_dim} / {s.heads}",
    "long-range layers; clusters": lambda s: f"{s.long_range_layers}; {s.clusters}",
    "segment tokens; window / stride": lambda s: f"{s.tokens:,}; {s.window} / {s.stride}",
    "segments per update; updates": lambda s: f"{s.batch}; {s.updates:,}",
    "optimizer; lr; warm-up; clip": lambda s: f"{s.optimizer}; {s.lr:g}; {s.warmup:,}; {s.clip:g}",
    "dropout; criterion": lambda s: f"{s.dropout:g}; {s.criterion}",
    "memory bank; K-Means every; iterations": lambda s: f"{s.memory_size:,}; {s.refresh_interval:,}; {s.kmeans_iters}",
    "eval-lm `--context-window`; `--max-tokens`": lambda s: f"{s.context_window:,}; {s.eval_max_tokens:,}",
}


def parse_train(argv):
    return options.parse_args_and_arch(options.get_training_parser(), [str(arg) for arg in argv])


def settings(args):
    return {key: value for key, value in vars(args).items() if key not in RUN_CONTROL}


def differences(left, right):
    keys = left.keys() | right.keys()
    return {key: (left.get(key), right.get(key)) for key in keys if left.get(key) != right.get(key)}


@pytest.mark.parametrize("preset,recipe", CASES)
def test_train_sh_runs_exactly_the_presets_settings(preset, recipe, tmp_path):
    """Every option fairseq ends up with, not only the flags the recipe names, equals the comparison's."""
    scale = PRESETS[preset][RECIPES[recipe]]
    recipe_args = parse_dry_run(recipe, "--preset", preset, GPUS="0")
    preset_args = parse_train(train_args(recipe_row(scale), scale, tmp_path, tmp_path / "save", PACKAGE))
    assert differences(settings(recipe_args), settings(preset_args)) == {}
    assert recipe_args.cluster_update_interval == scale.refresh_interval  # the setting that had drifted


@pytest.mark.parametrize("preset,recipe", CASES)
def test_eval_sh_scores_the_segments_its_preset_trains_on(preset, recipe):
    scale = PRESETS[preset][RECIPES[recipe]]
    out = script_ok(recipe, "eval", "--dry-run", "--preset", preset, "some/checkpoint.pt")
    argv = shlex.split(out.strip().splitlines()[-1])
    assert argv[0] == "fairseq-eval-lm"
    args = options.parse_args_and_arch(options.get_eval_lm_parser(), argv[1:])
    trained = parse_dry_run(recipe, "--preset", preset, GPUS="0")
    assert args.tokens_per_sample == trained.tokens_per_sample == scale.tokens
    assert (args.context_window, args.max_tokens, args.path) == (scale.context_window, scale.eval_max_tokens,
                                                                 "some/checkpoint.pt")  # fmt: skip
    assert 0 < args.context_window < args.tokens_per_sample <= args.max_tokens


def measured_command(level):
    """The fairseq-train command the small-scale table ran for its sliding-window row, seed 1."""
    text = MEASURED.read_text(encoding="utf-8")
    block = text.split(f"- {level} / window:")[1]
    return shlex.split(re.search(r"`(fairseq-train [^`]+)`", block).group(1))


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_small_recipe_trains_what_the_measured_table_ran(recipe):
    """train.sh --small with the table's two changes (no long-range layer, 150 updates) is the table's command:
    before the presets had one source, train.sh refreshed K-Means every 100 updates and the table every 50."""
    measured = parse_train(measured_command(RECIPES[recipe])[1:])
    ours = parse_dry_run(recipe, "--small", GPUS="0", LONG_RANGE="none", UPDATES="150")
    diff = differences(settings(ours), settings(measured))
    diff.pop("user_dir")  # the table ran from the repository root, with a relative --user-dir
    diff.pop("num_clusters")  # no long-range layer: the table left the flag out, train.sh passes the preset's
    assert diff == {}
    assert ours.cluster_update_interval == measured.cluster_update_interval == 50


@pytest.mark.parametrize("level", sorted(presets.LEVELS))
def test_paper_preset_states_the_size_of_its_named_architecture(level, tmp_path):
    """The paper preset leaves the model's size to clusterformer_lm_wiki103 / _enwik8: its own numbers must agree."""
    scale = PRESETS["paper"][level]
    assert not scale.model_dims
    args = parse_train(train_args(recipe_row(scale), scale, tmp_path, tmp_path / "save", PACKAGE))
    assert "--decoder-layers" not in train_args(recipe_row(scale), scale, tmp_path, tmp_path, PACKAGE)
    dims = (args.decoder_layers, args.decoder_attention_heads, args.decoder_embed_dim, args.decoder_ffn_embed_dim)
    assert dims == (scale.layers, scale.heads, scale.embed_dim, scale.ffn_dim)


def test_overrides_and_the_small_alias():
    assert vars(parse_dry_run("enwik8", "--small", GPUS="0")) == vars(
        parse_dry_run("enwik8", "--preset", "small", GPUS="0")
    )
    paper = parse_dry_run("wikitext103", GPUS="0", LAYERS="12", CLUSTER_UPDATE_INTERVAL="7", MAX_TOKENS="1")
    assert (paper.decoder_layers, paper.decoder_embed_dim, paper.cluster_update_interval) == (12, 1024, 7)
    smoke = parse_dry_run("wikitext103", "--preset", "smoke", GPUS="0", EMBED_DIM="48", LOG_INTERVAL="3")
    assert (smoke.decoder_embed_dim, smoke.decoder_layers, smoke.log_interval) == (48, 4, 3)
    code, out = script("wikitext103", "train", "--preset", "huge", "--dry-run", GPUS="0")
    assert code == 2 and "--preset must be paper, small or smoke, got 'huge'" in out
    code, out = script("enwik8", "eval", "--dry-run")
    assert code == 2 and "give CHECKPOINT" in out


def presets_table() -> str:
    """The markdown table of the presets, as docs/usage.md must show it."""
    lines = ["| setting | " + " | ".join(TABLE_COLUMNS) + " |", "| --- " * (len(TABLE_COLUMNS) + 1) + "|"]
    for label, show in TABLE_ROWS.items():
        cells = [show(PRESETS[preset][level]) for preset, level in TABLE_COLUMNS.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def test_the_docs_table_shows_what_the_presets_define():
    assert PRESETS["smoke"]["word"] == PRESETS["smoke"]["char"]  # one column for both levels
    assert presets_table() in USAGE.read_text(encoding="utf-8"), "docs/usage.md's presets table should be:\n" + (
        presets_table()
    )


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_old_name_of_the_smoke_preset_still_runs_it(recipe):
    """A command written before the rename (tiny is also the 64-dim clusterformer_lm_tiny) runs what --preset smoke
    runs, into smoke's checkpoint folder, and says that the preset was renamed."""
    for name, args in (("train", ()), ("eval", ("some/checkpoint.pt",))):
        old = script_ok(recipe, name, "--dry-run", "--preset", "tiny", *args, GPUS="0")
        new = script_ok(recipe, name, "--dry-run", "--preset", "smoke", *args, GPUS="0")
        assert "--preset tiny was renamed --preset smoke" in old and "renamed" not in new
        assert old.strip().splitlines()[-1] == new.strip().splitlines()[-1]
    assert parse_dry_run(recipe, "--preset", "tiny", GPUS="0").save_dir.endswith("-smoke")


def run_presets(*args):
    proc = subprocess.run(
        [sys.executable, str(PACKAGE / "scripts" / "lm" / "presets.py"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
    )  # fmt: skip
    return proc.returncode, proc.stdout


def test_print_flags_gives_the_row_asked_for():
    code, out = run_presets("--preset", "small", "--level", "char", "--print-flags", "--kind", "lsh",
                            "--clusters", "32", "--causality", "paper")  # fmt: skip
    assert code == 0, out
    args = parse_train(["data", "--user-dir", PACKAGE, *out.splitlines()])  # one token per line: "(0.9, 0.98)" too
    assert (args.long_range_layer, args.num_clusters, args.cluster_causality) == ("lsh", 32, "paper")
    assert (args.tokens_per_sample, args.adam_betas) == (PRESETS["small"]["char"].tokens, "(0.9, 0.98)")
    code, out = run_presets("--preset", "paper", "--level", "word", "--print-flags")
    assert code == 0 and parse_train(["data", "--user-dir", PACKAGE, *out.splitlines()]).num_clusters == 512
    code, out = run_presets("--preset", "medium", "--level", "word", "--shell")
    assert code == 2 and "--preset" in out
