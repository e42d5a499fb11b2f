"""The scored runs of the results folders the QA report scripts take (qa_report/table.py, qa_budget_report.py).

A results folder holds one folder per scored run, with the run's summary.json (benchmarks/qa_cpu_collect.py's and
benchmarks/qa_device's layout). A --results entry is a folder, or KIND=DIR for only DIR's runs of one kind: the seeds
of one budget can lie in several series' folders, beside superseded runs of other kinds. Each script places a run by
its own key ((contexts, kind, seed) for table b, (variant, seed, updates) for the budget curve); two runs in one
place are refused, naming both folders, because pooling them would count one seed twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

Summary = dict[str, Any]


def row_kind(summary: Summary) -> str:
    """The row a run belongs to: its variant (hybrid layers, one layer) where it has one, else its kind."""
    settings = summary["settings"]
    return settings.get("variant", settings["kind"])


def scored_runs(
    entries: Iterable[str], place: Callable[[Path, Summary], Hashable | None], place_names: str
) -> dict[Hashable, tuple[Path, Summary]]:
    """Place -> (run folder, summary) for every run of every --results entry; ``place`` returns None for a run the
    caller does not want. ``place_names`` says what a place is made of, for the message refusing two runs in one."""
    runs: dict[Hashable, tuple[Path, Summary]] = {}
    for entry in entries:
        only, _, name = str(entry).rpartition("=")
        folder = Path(name)
        if not folder.is_dir():
            raise ValueError(f"--results {entry}: {folder} is not a folder")
        for summary_file in sorted(folder.glob("*/summary.json")):
            summary = json.loads(summary_file.read_text(encoding="utf-8"))
            if only and row_kind(summary) != only:
                continue
            key = place(summary_file.parent, summary)
            if key is None:
                continue
            if key in runs:
                raise ValueError(f"--results: {summary_file.parent} and {runs[key][0]} are both {key} ({place_names}):"
                                 " give one of them (KIND=DIR takes one kind of a folder)")  # fmt: skip
            runs[key] = (summary_file.parent, summary)
    return runs
