"""The device call of table b, dry-run on the CPU at tiny sizes: benchmarks/qa_device/prepare.sh (a tiny BERT made
here instead of all-MiniLM-L6-v2, three short SQuAD articles, no bundle) and benchmarks/qa_device/device_run.sh
(SKIP_INSTALL=1, QA_DEVICE_TINY=1), as the lent GPU machine runs them: what comes back through $OUT stays within the
device tool's limits, the report holds the runs' rows, a second call skips the runs the first one finished, and a
call whose budget ends before its runs stops them and still packs."""

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.qa_device.runs import (
    DEFAULT_KINDS,
    REACH_QUESTIONS,
    VARIANTS,
    Paths,
    Run,
    measure_command,
    plan,
    reach_command,
    train_command,
)
from tests.conftest import REPO, subprocess_env
from tests.recipe_runs import snapshot
from tests.test_qa_pretrained_recipe import small_squad, tiny_bert

ENV = subprocess_env(OMP_NUM_THREADS="1")
OUT_LIMITS = dict(files=8, bytes=16 * 2**20, depth=2)  # the device tool's: files back from $OUT


def bash(script, *args, timeout=600, **env):
    proc = subprocess.run(["bash", REPO / "benchmarks/qa_device" / script, *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, env={**ENV, **env}, timeout=timeout)  # fmt: skip
    return proc


@pytest.fixture(scope="module")
def payload(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa_device")
    data, held_out = small_squad(root)
    proc = bash("prepare.sh", "--hf", tiny_bert(root), "--data", data, "--work", root / "work", "--out",
                root / "payload", "--no-bundle", TRAIN_ARTICLES="2")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root, data, held_out


def device_call(data, payload, results, out, args, minutes="10"):
    flags = f"--squad {data}/dev-v1.1.json --held-out-from 2 --no-table-a --parallel 2 {args}"
    return bash("device_run.sh", SKIP_INSTALL="1", QA_DEVICE_TINY="1", QA_DEVICE_MINUTES=minutes,
                PAYLOAD=str(payload), RESULTS=str(results), OUT=str(out), QA_DEVICE_ARGS=flags)  # fmt: skip


def check_out_limits(out: Path) -> set[str]:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= OUT_LIMITS["files"]
    for f in files:
        assert f.stat().st_size <= OUT_LIMITS["bytes"] and len(f.relative_to(out).parts) <= OUT_LIMITS["depth"] + 1
        assert re.fullmatch(r"[A-Za-z0-9._-]+", f.name)
    return {f.name for f in files}


def archived(out: Path) -> dict[str, bytes]:
    with tarfile.open(out / "results.tgz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.e2e
def test_the_device_call_dry_run_trains_scores_reports_and_resumes(payload):
    root, data, held_out = payload
    sums = (root / "payload/SHA256SUMS").read_text()
    assert "./encoder/model.pt" in sums and "./data.tar.xz" in sums
    info = json.loads((root / "payload/payload.json").read_text())
    assert info["vocab_cut"]["dtype"] == "float16" and info["vocab_cut"]["rows"] < info["vocab_cut"]["source_rows"]

    # call 1: seed 1 of none and cluster
    proc = device_call(data, root / "payload", root / "results", root / "out1", "--seeds 1 --kinds none,cluster")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert check_out_limits(root / "out1") == {"results.tgz", "report.md", "report.json", "device_run.log"}
    files = archived(root / "out1")
    questions = sum(len(p["qas"]) for p in held_out["paragraphs"])
    for run in ("article_none_seed1", "article_cluster_seed1"):
        summary = json.loads(files[f"results/{run}/summary.json"])
        assert summary["answered"] == summary["questions"] == questions and summary["updates"] == 3
        assert len(json.loads(files[f"results/{run}/valid.pred.json"])) == questions
        assert "--autocast-bf16" in files[f"results/{run}/train.log"].decode()
    assert "results/article_cluster_seed1/reach.json" in files and "results/article_none_seed1/reach.json" not in files
    report = (root / "out1/report.md").read_text()
    assert "| b. whole articles, sliding windows only (`none`), seed 1 | " in report
    assert re.search(r"\| `cluster` \| 1 \| [+-]\d+\.\d\d \[[+-]\d+\.\d\d, [+-]\d+\.\d\d\] \|", report)
    assert "| article_cluster_seed1 | 5 | " in report and "| article_cluster_seed1 | 6 | " in report

    # call 2, on what call 1 left (as a later session commits it): its runs are not trained again; the new variants
    kinds = "none,cluster,sparse,cluster-hybrid,cluster-layer6"
    proc = device_call(data, root / "payload", root / "results", root / "out2", f"--seeds 1 --kinds {kinds}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for run in ("article_none_seed1", "article_cluster_seed1"):
        assert re.search(rf"{run}: finished in call \d+T\d+Z \(EM \d+\.\d\d\): not run again", proc.stdout)
        assert f"{run}: started" not in proc.stdout
    assert "article_sparse_seed1: started" in proc.stdout
    files = archived(root / "out2")
    runs = json.loads(files["results/runs.json"])
    new = ["article_sparse_seed1", "article_cluster-hybrid_seed1", "article_cluster-layer6_seed1"]
    assert {name: r["status"] for name, r in runs.items()} == dict.fromkeys(
        ["article_none_seed1", "article_cluster_seed1", *new], "done"
    )
    assert len({r["call"] for r in runs.values()}) == 2
    hybrid_log = files["results/article_cluster-hybrid_seed1/train.log"].decode()
    assert "--long-range-mode hybrid" in hybrid_log and "--long-range-layers 5,6" in hybrid_log
    assert "--long-range-layers 6 " in files["results/article_cluster-layer6_seed1/train.log"].decode()
    for run in new[1:]:  # qa-reach and the ablation on the new Cluster-Former runs, on the same held-out questions
        assert f"results/{run}/reach.json" in files
        summary = json.loads(files[f"results/{run}/summary.json"])
        assert summary["reach_questions"] == summary["settings"]["reach_questions"]
        ablation = json.loads(files[f"results/{run}/cluster_ablation.json"])
        expected = min(summary["settings"]["ablation_questions"], summary["questions"])
        assert summary["cluster_ablation"] and ablation["questions"] == expected
        assert set(ablation["answers"]) == {"trained", "shuffled", "identity"}
        # its trained pass is the run's own scoring (float32 both), on the first questions
        scored = json.loads(files[f"results/{run}/valid.pred.json"])
        assert all(scored[q] == a for q, a in ablation["answers"]["trained"].items())
    assert not json.loads(files["results/article_sparse_seed1/summary.json"])["cluster_ablation"]
    report = (root / "out2/report.md").read_text()
    assert "| b. whole articles, sparse layers 5, 6 (`sparse`), seed 1 | " in report
    assert re.search(r"\| `cluster-hybrid` \| 1 \| [+-]\d+\.\d\d \[", report)
    assert re.search(r"\| `cluster-layer6` \| 1 \| [+-]\d+\.\d\d \[", report)
    assert "| article_cluster-layer6_seed1 | 6 | " in report and "| article_cluster-layer6_seed1 | 5 | " not in report


@pytest.mark.e2e
def test_a_call_whose_budget_ends_stops_its_runs_and_still_packs(payload, tmp_path):
    root, data, _ = payload
    # 0.6 minutes less 30 s for packing: the budget ends while the run trains, or before the driver could start it
    proc = device_call(data, root / "payload", tmp_path / "results", tmp_path / "out", "--seeds 2 --kinds lsh", "0.6")
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert re.search(r"article_lsh_seed2: (stopped by the budget in its train stage|not started: the budget ended)",
                     proc.stdout)  # fmt: skip
    assert check_out_limits(tmp_path / "out") >= {"results.tgz", "device_run.log"}
    runs = json.loads(archived(tmp_path / "out")["results/runs.json"])
    assert runs["article_lsh_seed2"]["status"] in ("stopped", "not_started")
    assert not (tmp_path / "results/article_lsh_seed2/summary.json").exists()


def test_a_tiny_run_never_writes_into_the_committed_results(tmp_path):
    committed = REPO / "benchmarks/results/qa_pretrained/device"  # the GPU's results, committed
    before = snapshot(committed)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.qa_device", "--payload", tmp_path, "--work", tmp_path,
                           "--results", REPO / "benchmarks/results/qa_pretrained/device", "--stop-at", "0", "--tiny"],
                          capture_output=True, text=True, cwd=REPO, env=ENV, timeout=120)  # fmt: skip
    assert proc.returncode != 0 and "a --tiny run does not write into benchmarks/results/" in proc.stderr
    assert snapshot(committed) == before


def test_the_second_call_reuses_the_committed_none_rows_and_runs_the_new_variants():
    """The committed `none` rows (and the first call's replacement layers) have the settings these runs would have,
    so the driver skips them; the default variants are the one-layer series (Cluster-Former at 6 and at 5, LSH and
    sparse at 6), two seeds each: 8 runs, side by side as the first call's 8."""
    committed = REPO / "benchmarks/results/qa_pretrained/device"
    todo = []
    for run in plan([1, 2], DEFAULT_KINDS.split(","), table_a=True):
        summary = committed / run.name / "summary.json"
        if summary.is_file() and json.loads(summary.read_text())["settings"] == run.settings(tiny=False):
            continue
        todo.append(run.name)
    assert todo == [f"article_{v}_seed{s}" for s in (1, 2) for v in DEFAULT_KINDS.split(",")[1:]]
    for old in ("none", "cluster", "lsh", "sparse"):
        for seed in (1, 2):
            run = Run("article", old, seed)
            saved = json.loads((committed / run.name / "summary.json").read_text())["settings"]
            assert saved == run.settings(tiny=False)


def test_the_variants_commands_say_their_mode_layers_and_reach_subset(tmp_path):
    paths = Paths(tmp_path / "data", tmp_path / "encoder", tmp_path / "work", tmp_path / "results")
    commands = {v: train_command(Run("article", v, 1), paths, False, 2)[0] for v in VARIANTS}
    for variant, command in commands.items():
        mode, layers = (
            command[command.index("--long-range-mode") + 1],
            command[command.index("--long-range-layers") + 1],
        )
        assert (mode, layers) == VARIANTS[variant][1:]
    env = train_command(Run("article", "sparse-hybrid", 1), paths, False, 2)[1]
    assert env["LONG_RANGE"] == "sparse"
    reach = reach_command(Run("article", "cluster-hybrid", 2), paths, False, tmp_path / "reach.json")
    assert reach[reach.index("--max-examples") + 1] == str(REACH_QUESTIONS)
    reached = ["cluster", "lsh", "cluster-hybrid", "lsh-hybrid", "cluster-layer6", "cluster-layer5", "lsh-layer6"]
    assert [v for v in VARIANTS if Run("article", v, 1).reach] == reached
    # the ablation: the Cluster-Former runs after the first call's, whose settings stay as they ran
    assert [v for v in VARIANTS if Run("article", v, 1).ablation] == ["cluster-hybrid", "cluster-layer6",
                                                                       "cluster-layer5"]  # fmt: skip
    assert "ablation_questions" not in Run("article", "cluster", 1).settings(tiny=False)
    measure = measure_command(Run("article", "cluster-layer6", 1), paths, False, tmp_path / "run")[2]
    assert measure.index("qa.scripts.reach") < measure.index("-m benchmarks.qa_cluster_ablation")
    assert f"--max-examples {REACH_QUESTIONS} " in measure and "test -s" in measure.split(";")[-1]
    assert "qa_cluster_ablation" not in measure_command(Run("article", "lsh-layer6", 1), paths, False, tmp_path)[2]
    with pytest.raises(ValueError, match="--kinds: 'cluster-hybird'"):
        plan([1], ["cluster-hybird"], table_a=False)
