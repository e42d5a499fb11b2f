"""The K-Means benchmark's table names the machine its figures were measured on, not the machine that renders it:
the committed table re-renders elsewhere with the same Machine line, and new rows carry their own machine."""

from __future__ import annotations

import importlib
import json
import shutil
from argparse import Namespace

from tests.conftest import REPO


def report_module():
    return importlib.import_module("benchmarks.kmeans_report")


def test_the_committed_table_re_renders_with_its_own_machine_line(tmp_path):
    for path in (REPO / "benchmarks" / "results").glob("kmeans_*"):
        shutil.copy(path, tmp_path)
    report_module().render(Namespace(out_dir=tmp_path))
    committed = (REPO / "benchmarks" / "results" / "kmeans.md").read_text()
    assert (tmp_path / "kmeans.md").read_text() == committed


def test_rows_name_the_machine_recorded_with_them_and_old_rows_the_matmul_rate_s(tmp_path, monkeypatch):
    report = report_module()
    monkeypatch.setattr(report, "machine_info", lambda: {"cpu": "Renderer CPU", "cores": 64, "torch": "9.9"})
    row = {"device": "cpu", "bank": 1000, "dim": 8, "clusters": 4, "backend": "faiss", "iters": 2, "threads": 1}
    row |= {"times_s": [1.0], "median_s": 1.0, "median_cpu_s": 1.0, "load_median": 0, "load_min": 0, "load_max": 0}
    rate = {"gflops": 10.0, "threads": 1, "cpu": "Rate CPU", "cores": 2, "torch": "2.0"}
    (tmp_path / "kmeans_matmul_rate.json").write_text(json.dumps(rate))
    new = row | {"dim": 16, "machine": {"cpu": "Row CPU", "cores": 4, "torch": "2.1"}}
    (tmp_path / "kmeans_refresh.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (row, new)))
    first = report.render(Namespace(out_dir=tmp_path)).splitlines()[0]
    assert first == "Machine: Rate CPU, 2 cores, torch 2.0; Row CPU, 4 cores, torch 2.1."
    assert "Renderer CPU" not in (tmp_path / "kmeans.md").read_text()
