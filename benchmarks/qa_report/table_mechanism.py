"""The mechanism tables under table b (benchmarks/qa_report/table.py): where the long-range layers' question tokens look
(reach.json), what closing the hybrid gates does (gate_ablation.json), and whether one more K-Means refresh would move
the centroids (centroid_shift.json). Each takes the runs in the table's order (kind, then seed)."""

from __future__ import annotations

from typing import Any

SCORES = ("exact_match", "f1")  # the official SQuAD metrics, as table.py's METRICS names them


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def reach_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per measured run and long-range layer: the share of the question tokens' keys outside their own window that
    lie in the answer's paragraph, against that paragraph's share of the context; the sliding window's in-paragraph
    share beside it."""
    rows = []
    for run in sorted((r for r in runs if r["reach"]), key=lambda r: r["contexts"]):
        window = run["reach"]["rows"][0]
        for layer in run["reach"]["rows"][1:]:
            rows.append({"run": run["name"], "layer": layer["layer"], "questions": layer["questions"],
                         **{k: layer.get(k) for k in ("outside_window_share", "outside_window_paragraph_share",
                                                      "outside_window_uniform_share", "paragraph_share",
                                                      "uniform_share", "entropy_bits", "max_entropy_bits",
                                                      "mean_abs_far_gate")},
                         "window_paragraph_share": window["paragraph_share"]})  # fmt: skip
    return rows


def gate_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per hybrid run with a benchmarks/qa_gate_ablation.py report: EM / F1 as trained and with every gate at 0 on
    its questions, and how many of its as-trained answers equal the run's own prediction file (a check that the
    ablation scored this run's checkpoint; batching may still flip a near tie)."""
    rows = []
    for run in (r for r in runs if r["gate_ablation"]):
        ablation = run["gate_ablation"]
        trained = ablation["answers"]["as_trained"]
        rows.append({"run": run["name"], "questions": ablation["questions"],
                     "answers_changed": ablation["answers_changed"],
                     "same_as_prediction_file": sum(run["predictions"].get(q) == a for q, a in trained.items()),
                     **{m: ablation[m] for m in SCORES}})  # fmt: skip
    return rows


def shift_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per Cluster-Former layer of a run with a benchmarks/centroid_shift.py report: the next refresh against the
    installed centroids, beside the same bank fit with another seed (K-Means' own spread)."""
    return [
        {"run": run["name"], **layer}
        for run in runs
        if run["centroid_shift"]
        for layer in run["centroid_shift"]["layers"]
    ]


def mechanism_markdown(report: dict[str, Any]) -> list[str]:
    """The report's mechanism sections as markdown lines, each table only where some run measured it."""
    lines: list[str] = []
    if report["reach"]:
        lines += ["Where question tokens look (fairseq-clusterformer-qa-reach): of their keys outside their own "
                  "window, the share in the answer's paragraph, against the paragraph's share of the context:", "",
                  "| run | layer | questions | outside own window | of those in answer paragraph | uniform | "
                  "sliding window: in answer paragraph | hybrid gate, mean abs |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in report["reach"]:
            lines.append(f"| {r['run']} | {r['layer']} | {r['questions']} | {fmt(r['outside_window_share'], 3)} | "
                         f"{fmt(r['outside_window_paragraph_share'], 3)} | {fmt(r['outside_window_uniform_share'], 3)}"
                         f" | {fmt(r['window_paragraph_share'], 3)} | {fmt(r.get('mean_abs_far_gate'), 3)} |"
                         )  # fmt: skip
    if report["gate_ablation"]:
        lines += ["", "Closing the hybrid layers' gates at scoring time (benchmarks/qa_gate_ablation.py: the same "
                  "checkpoint with every gate at 0 computes only its sliding windows), on the first held-out questions;"
                  " difference gates at 0 minus as trained, 95 % bootstrap interval over the questions:", "",
                  "| run | questions | EM as trained / gates at 0 | EM difference | F1 as trained / gates at 0 | "
                  "F1 difference | answers changed | as trained = prediction file |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in report["gate_ablation"]:
            cells = [f"{fmt(r[m]['as_trained'])} / {fmt(r[m]['gates_at_0'])} | {r[m]['difference']:+.2f} "
                     f"[{r[m]['interval'][0]:+.2f}, {r[m]['interval'][1]:+.2f}]" for m in SCORES]  # fmt: skip
            lines.append(f"| {r['run']} | {r['questions']} | {cells[0]} | {cells[1]} | {r['answers_changed']} | "
                         f"{r['same_as_prediction_file']} |")  # fmt: skip
    if report["centroid_shift"]:
        lines += ["", "Would one more K-Means refresh move the centroids (benchmarks/centroid_shift.py, on the memory "
                  "bank of checkpoint_last.pt)? Nearest cosine and adjusted Rand of the banked states' clusters, the "
                  "next refresh against the installed centroids, and the same bank fit with the following seed:", "",
                  "| run | layer | refreshes | banked states | next refresh: cosine / adjusted Rand | "
                  "reseeded: cosine / adjusted Rand |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in report["centroid_shift"]:
            lines.append(f"| {r['run']} | {r['layer']} | {r['refreshes']} | {r['banked_states']} | "
                         f"{fmt(r['nearest_cosine'], 3)} / {fmt(r['agreement'], 3)} | "
                         f"{fmt(r['reseeded_nearest_cosine'], 3)} / {fmt(r['reseeded_agreement'], 3)} |")  # fmt: skip
    return lines
