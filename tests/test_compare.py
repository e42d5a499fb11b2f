"""The Table 3 comparison driver: its rows, its data preparation, and every row through the real fairseq-train and
fairseq-eval-lm at the smoke preset, and the smoke preset's old name."""

import json
import os
import re
import subprocess
import sys

import pytest
from fairseq import options

from benchmarks.lm_compare import compare as compare_lm
from benchmarks.lm_compare import data as compare_data
from fairseq_clusterformer.layers.kinds import long_range_choices
from fairseq_clusterformer.scripts.lm.presets import PRESETS, ROWS, train_args
from tests.conftest import PACKAGE, REPO, SLICE

CHARS = REPO / "examples" / "data" / "tinyshakespeare-slice"


def test_rows_are_the_papers_table_3_in_both_causality_modes():
    combos = {(row.kind, row.clusters, row.causality) for row in ROWS}
    assert ("none", 0, "strict") in combos
    for causality in ("strict", "paper"):
        assert {("sparse", 0, causality), ("lsh", 64, causality)} <= combos
        assert {("cluster", p, causality) for p in (64, 256, 512)} <= combos
    assert len(combos) == len(ROWS) == 11 and len({row.key for row in ROWS}) == 11
    assert {row.kind for row in ROWS} <= set(long_range_choices())
    assert compare_lm.select_rows("window,cluster64-paper") == [ROWS[0], ROWS[8]]
    with pytest.raises(ValueError, match="--rows: unknown row"):
        compare_lm.select_rows("window,nope")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_row_of_a_level_gets_the_same_model_and_schedule(preset, tmp_path):
    """fairseq's own parser reads every row's command; only the long-range settings differ between rows."""
    for level, scale in PRESETS[preset].items():
        shared = set()
        for row in ROWS:
            args = options.parse_args_and_arch(
                options.get_training_parser(), train_args(row, scale, tmp_path, tmp_path / "save", PACKAGE)
            )
            assert (args.long_range_layer, args.cluster_causality) == (row.kind, row.causality)
            if row.clusters:
                assert args.num_clusters == row.clusters
            assert args.tokens_per_sample > 2 * args.window_size or preset == "smoke"
            shared.add(
                (args.decoder_layers, args.decoder_embed_dim, args.long_range_layers, args.max_update, args.lr[0])
            )
        assert len(shared) == 1, f"{preset}/{level}: rows differ in {shared}"


def test_the_old_name_of_the_smoke_preset_still_runs_it(tmp_path, capsys):
    """--preset tiny, before the rename to smoke (tiny is also the 64-dim clusterformer_lm_tiny), still parses."""
    assert compare_lm.parse_args(["--preset", "tiny", "--work", str(tmp_path)]).preset == "smoke"
    assert "--preset tiny was renamed --preset smoke" in capsys.readouterr().err
    assert compare_lm.parse_args(["--work", str(tmp_path)]).preset == "small"
    assert capsys.readouterr().err == ""


def test_evaluation_text_is_cut_between_articles():
    lines = (SLICE / "valid.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    cut = compare_data.split_at_article(lines)
    assert 0 < cut < len(lines)
    assert not lines[cut].strip() and re.fullmatch(r" = [^=].* = \n", lines[cut + 1])  # a new article opens there
    plain = [f"line {i}\n" for i in range(10)]
    assert compare_data.split_at_article(plain) == 5


def run_compare(work, *args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "benchmarks.lm_compare.compare", "--preset", "smoke", "--work", work]
    proc = subprocess.run(
        [*command, "--threads", "1", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800,
    )
    return proc.returncode, proc.stdout


def table_rows(markdown, level_title):
    section = markdown.split(f"**{level_title}**")[1].split("\n\n")[1]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """Every row at word level and two rows at character level, on the committed slices."""
    work = tmp_path_factory.mktemp("compare")
    text = work / "input"
    text.mkdir()
    lines = (SLICE / "train.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (text / "train.txt").write_text("".join(lines[:300]), encoding="utf-8")
    data = {"--word-train": text / "train.txt", "--word-eval": SLICE / "valid.txt", "--char-text": CHARS / "valid.txt"}
    flags = [str(part) for item in data.items() for part in item]
    first = run_compare(work, "--levels", "word", *flags)
    second = run_compare(work, "--levels", "char", "--rows", "window,cluster64-strict", *flags)
    again = run_compare(work, "--levels", "word,char", "--rows", "window,cluster64-strict", *flags)
    return work, first, second, again


@pytest.mark.e2e
def test_every_row_trains_and_evaluates_through_the_real_cli(compared):
    work, (code, out), _, _ = compared
    assert code == 0, out[-4000:]
    rows = table_rows((work / "results.md").read_text(), "Word level")
    assert list(rows) == [row.label for row in ROWS], rows
    params = set()
    for row in ROWS:
        ppl, valid_ppl, count, updates, train_s, eval_s, seeds, spread = rows[row.label]
        assert (seeds, spread) == ("1", "-")
        result = json.loads((work / "word" / row.key / "result.json").read_text())
        log = (work / "word" / row.key / "eval.log").read_text()
        loss = float(re.search(r"Loss \(base 2\): ([\d.]+)", log).group(1))
        assert float(ppl) == pytest.approx(2**loss, rel=1e-3) == pytest.approx(result["metric"], rel=1e-3)
        assert int(updates) == PRESETS["smoke"]["word"].updates
        assert f"--long-range-layer {row.kind} " in result["train_command"]
        assert f"--cluster-causality {row.causality}" in result["train_command"]
        assert (f"--num-clusters {row.clusters}" in result["train_command"]) == bool(row.clusters)
        assert float(train_s) > 0 and float(eval_s) >= 0 and float(valid_ppl) > 1
        params.add(count)
    assert len(params) == 1, f"rows differ in parameter count: {params}"
    assert "WARNING" not in (work / "results.md").read_text()


@pytest.mark.e2e
def test_character_level_reports_bits_per_character(compared):
    work, _, (code, out), _ = compared
    assert code == 0, out[-4000:]
    rows = table_rows((work / "results.md").read_text(), "Character level")
    assert list(rows) == ["Sliding window", "Cluster-Former (#C=64), strict"]
    for key, label in (("window", "Sliding window"), ("cluster64-strict", "Cluster-Former (#C=64), strict")):
        log = (work / "char" / key / "eval.log").read_text()
        bpc = float(re.search(r"Loss \(base 2\): ([\d.]+)", log).group(1))
        assert float(rows[label][0]) == pytest.approx(bpc, abs=1e-3)
        assert 0 < bpc < 8  # bits per byte token
    assert "test bpc" in (work / "results.md").read_text()


@pytest.mark.e2e
def test_a_second_run_skips_the_rows_already_done(compared):
    work, _, _, (code, out) = compared
    assert code == 0, out[-4000:]
    assert out.count("done before, skipped") == 4, out[-3000:]  # two rows at each of the two levels
    assert "training" not in out
    assert len(table_rows((work / "results.md").read_text(), "Word level")) == len(ROWS)  # earlier rows kept


@pytest.mark.e2e
def test_several_seeds_give_a_mean_and_a_spread(compared):
    work, _, _, _ = compared
    flags = ["--word-train", work / "input" / "train.txt", "--word-eval", SLICE / "valid.txt"]
    code, out = run_compare(work, "--levels", "word", "--rows", "window", "--seeds", "1,2", *flags)
    assert code == 0, out[-4000:]
    assert out.count("done before, skipped") == 1 and "seed 2: training" in out  # seed 1 came from the fixture
    runs = [json.loads((work / "word" / key / "result.json").read_text()) for key in ("window", "window-seed2")]
    assert [r["seed"] for r in runs] == [1, 2]
    assert (
        runs[0]["train_command"].replace("--seed 1", "--seed 2").replace("/window/", "/window-seed2/")
        == runs[1]["train_command"]
    )
    assert runs[0]["metric"] != runs[1]["metric"], "a second seed must train a different model"
    ppl, *_, seeds, spread = table_rows((work / "results.md").read_text(), "Word level")["Sliding window"]
    assert seeds == "1,2"
    assert float(ppl) == pytest.approx((runs[0]["metric"] + runs[1]["metric"]) / 2, abs=1e-3)
    assert float(spread) == pytest.approx(abs(runs[0]["metric"] - runs[1]["metric"]), abs=2e-3)
    code, out = run_compare(work, "--levels", "word", "--rows", "window", "--seeds", "0")
    assert code == 2 and "--seeds" in out
