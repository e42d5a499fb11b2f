"""benchmarks/qa_series.py, a series of table b from its settings file: on a tiny encoder, a pair of runs stopped by
MAX_HOURS leaves a progress record each and no result; the same command later finishes them, runs reach and the
cluster ablation on the Cluster-Former run, collects both and prints the paired table; a third call finds every
run committed and runs nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, subprocess_env
from tests.test_qa_pretrained_recipe import small_squad, tiny_bert

SERIES = [sys.executable, "-m", "benchmarks.qa_series"]
SETTINGS = dict(TRAIN_ARTICLES=2, UPDATES=3, BATCH=4, WINDOW=48, STRIDE=40, MAX_QUESTION=60, MAX_CONTEXT_TRAIN=256,
                CLUSTERS=4, KMEANS_INTERVAL=2, MEMORY=2000, THREADS=1, PRECISION="fp32", SAVE_INTERVAL=1)  # fmt: skip


def series_command(folder, runs, src, data, *more):
    return [*SERIES, str(folder), "--runs", str(runs), *more, "--", "--hf", str(src),
            "--data", str(data)]  # fmt: skip


def write_series(folder, squad, max_hours):
    series = {
        "contexts": "article",
        "settings": {**SETTINGS, "MAX_HOURS": max_hours},
        "variants": {"none": {"KIND": "none"}, "cluster-layer6": {"KIND": "cluster", "LONG_RANGE_LAYERS": 6}},
        "seeds": [2],
        "parallel": 2,
        "reach": ["cluster-layer6"],
        "ablation": ["cluster-layer6"],
        "analysis_questions": 8,
        "table": {"squad": str(squad / "dev-v1.1.json"), "held_out_from": 2},
    }
    (folder / "series.json").write_text(json.dumps(series), encoding="utf-8")


def run(command):
    proc = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.e2e
def test_a_series_trains_what_it_lacks_resumes_collects_and_prints_its_table(tmp_path):
    src = tiny_bert(tmp_path)
    data, _ = small_squad(tmp_path)
    folder, runs = tmp_path / "series", tmp_path / "runs"
    folder.mkdir()
    command = series_command(folder, runs, src, data)
    write_series(folder, data, max_hours=0.000001)  # stops each run after its first update
    out = run(command)
    assert out.count("stopped by MAX_HOURS") == 2, out
    records = sorted(p.name for p in (folder / "progress").iterdir())
    assert records == ["article_cluster-layer6_seed2.json", "article_none_seed2.json"], records
    assert json.loads((folder / "progress" / records[0]).read_text())["updates_done"] == 1
    assert not any(p.name.startswith("article_") and p.is_dir() for p in folder.iterdir())

    write_series(folder, data, max_hours=1)
    out = run(command)
    cluster, none = folder / "article_cluster-layer6_seed2", folder / "article_none_seed2"
    assert json.loads((none / "summary.json").read_text())["settings"]["updates"] == 3
    for name in ("summary.json", "valid.pred.json", "reach.json", "cluster_ablation.json"):
        assert (cluster / name).is_file(), name
    assert not (none / "reach.json").exists() and not (none / "cluster_ablation.json").exists()
    assert "cluster-layer6" in out and "| none seed 2: to run" in out  # the table's row, after the plan
    for record in records:  # the stopped runs' records now name the finished checkpoints
        assert json.loads((folder / "progress" / record).read_text())["updates_done"] == 3

    out = run(command)
    assert "to run" not in out and out.count(": committed") == 2, out


def test_a_series_file_naming_an_unknown_variant_is_refused(tmp_path):
    series = dict(contexts="article", settings={}, variants={"none": {"KIND": "none"}}, seeds=[1])
    series["ablation"] = ["cluster-layer6"]
    (tmp_path / "series.json").write_text(json.dumps(series), encoding="utf-8")
    proc = subprocess.run([*SERIES, str(tmp_path), "--runs", str(tmp_path / "r"), "--dry-run"],
                          env=subprocess_env(), capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert proc.returncode == 2 and "'ablation' names ['cluster-layer6']" in proc.stderr, proc.stderr


def write_json(folder, content):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "series.json").write_text(json.dumps(content), encoding="utf-8")


def test_a_series_says_only_what_differs_from_its_base(tmp_path, capsys):
    """'base': settings and table merged key by key, a variants list keeps the base's, the analyses follow the
    variants kept, baseline_from stays relative to the file that names it; a loop of bases and a variant the base
    lacks are refused."""
    from benchmarks.qa_series import load_series

    write_json(tmp_path / "root" / "first", {
        "contexts": "article", "settings": {"UPDATES": 400, "LR": "1e-4"}, "seeds": [1, 2],
        "variants": {"none": {"KIND": "none"}, "cluster-layer6": {"KIND": "cluster", "LONG_RANGE_LAYERS": 6},
                     "sparse-layer6": {"KIND": "sparse", "LONG_RANGE_LAYERS": 6}},
        "reach": ["cluster-layer6", "sparse-layer6"],
        "table": {"held_out_from": 40, "baseline_from": "../baseline"}})  # fmt: skip
    write_json(tmp_path / "second", {"base": "../root/first", "settings": {"UPDATES": 800}, "seeds": [3],
                                     "variants": ["none", "cluster-layer6"], "table": {"squad": "s.json"}})  # fmt: skip
    series = load_series(tmp_path / "second")
    assert series["settings"] == {"UPDATES": 800, "LR": "1e-4"} and series["seeds"] == [3]
    assert list(series["variants"]) == ["none", "cluster-layer6"] and series["reach"] == ["cluster-layer6"]
    assert series["table"] == {"held_out_from": 40, "squad": "s.json",
                               "baseline_from": str((tmp_path / "root" / "baseline").resolve())}  # fmt: skip

    write_json(tmp_path / "stray", {"base": "../second", "variants": ["sparse-layer6"]})
    with pytest.raises(SystemExit):
        load_series(tmp_path / "stray")
    assert "'variants' names ['sparse-layer6'], not among its base's" in capsys.readouterr().err
    write_json(tmp_path / "a", {"base": "../b"})
    write_json(tmp_path / "b", {"base": "../a"})
    with pytest.raises(SystemExit):
        load_series(tmp_path / "a")
    assert "the 'base' chain comes back to it" in capsys.readouterr().err


def test_the_committed_800_update_series_is_the_budget_series_at_800_updates():
    from benchmarks.qa_series import load_series

    results = REPO / "benchmarks" / "results" / "qa_pretrained"
    budget, middle = load_series(results / "cpu_budget"), load_series(results / "cpu_budget_800")
    assert middle["settings"] == {**budget["settings"], "UPDATES": 800}
    assert middle["variants"] == {name: budget["variants"][name] for name in ("none", "cluster-layer6")}
    assert {k: v for k, v in middle.items() if k not in ("settings", "variants")} == {
        k: v for k, v in budget.items() if k not in ("settings", "variants")}


def test_seeds_and_variants_choose_the_runs_of_one_call(tmp_path, capsys):
    """--seeds / --variants keep those runs, in the series' order (a session with time for one pair runs one pair);
    a seed or variant the series lacks is refused, naming the flag."""
    from benchmarks.qa_series import main

    write_json(tmp_path / "s", dict(contexts="article", settings={"THREADS": 1}, seeds=[1, 2],
                                    variants={"none": {"KIND": "none"}, "cluster-layer6": {"KIND": "cluster"},
                                              "sparse-layer6": {"KIND": "sparse"}}))  # fmt: skip
    command = [str(tmp_path / "s"), "--runs", str(tmp_path / "runs"), "--dry-run"]
    assert main([*command, "--seeds", "2", "--variants", "cluster-layer6", "none"]) == 0
    planned = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    assert planned == ["| none seed 2", "| cluster-layer6 seed 2"], planned
    main(command)
    assert len(capsys.readouterr().out.splitlines()) == 6
    main([*command, "--seeds", "1", "--variants", "none", "--threads", "2"])  # one run alone takes both cores
    assert " THREADS=2 " in capsys.readouterr().out
    for flag, value in (("--seeds", "3"), ("--variants", "lsh-layer6")):
        with pytest.raises(SystemExit):
            main([*command, flag, value])
        assert f"{flag} {value}: not among the series'" in capsys.readouterr().err
