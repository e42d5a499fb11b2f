"""The device call of table b, dry-run on the CPU at tiny sizes: benchmarks/qa_device/prepare.sh (a tiny BERT made
here instead of all-MiniLM-L6-v2, three short SQuAD articles, no bundle) and benchmarks/qa_device/device_run.sh
(SKIP_INSTALL=1, QA_DEVICE_TINY=1), as the lent GPU machine runs them: what comes back through $OUT stays within the
device tool's limits, the report holds the runs' rows, a second call skips the runs the first one finished, and a
call whose budget ends before its runs stops them and still packs."""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.recipe_runs import snapshot
from tests.test_qa_pretrained_recipe import small_squad, tiny_bert

ENV = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", OMP_NUM_THREADS="1")
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

    # call 2, on what call 1 left (as a later session commits it): its runs are not trained again
    proc = device_call(data, root / "payload", root / "results", root / "out2", "--seeds 1 --kinds none,cluster,sparse")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for run in ("article_none_seed1", "article_cluster_seed1"):
        assert re.search(rf"{run}: finished in call \d+T\d+Z \(EM \d+\.\d\d\): not run again", proc.stdout)
        assert f"{run}: started" not in proc.stdout
    assert "article_sparse_seed1: started" in proc.stdout
    runs = json.loads(archived(root / "out2")["results/runs.json"])
    assert {name: r["status"] for name, r in runs.items()} == dict.fromkeys(
        ["article_none_seed1", "article_cluster_seed1", "article_sparse_seed1"], "done"
    )
    assert len({r["call"] for r in runs.values()}) == 2
    assert "| b. whole articles, `sparse`, seed 1 | " in (root / "out2/report.md").read_text()


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
    proc = subprocess.run([sys.executable, REPO / "benchmarks/qa_device", "--payload", tmp_path, "--work", tmp_path,
                           "--results", REPO / "benchmarks/results/qa_pretrained/device", "--stop-at", "0", "--tiny"],
                          capture_output=True, text=True, cwd=REPO, env=ENV, timeout=120)  # fmt: skip
    assert proc.returncode != 0 and "a --tiny run does not write into benchmarks/results/" in proc.stderr
    assert snapshot(committed) == before
