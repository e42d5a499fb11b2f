"""The paired bootstrap (benchmarks/qa_report/paired_bootstrap.py) on cases computed by hand, and the table b report
(benchmarks/qa_report/table.py) on prediction files whose scores are known question by question."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.qa_report.paired_bootstrap import bootstrap_interval, paired_differences
from tests.conftest import REPO


def test_the_interval_of_identical_systems_is_zero():
    assert bootstrap_interval(np.zeros(50)) == (0.0, 0.0)
    assert bootstrap_interval(np.full(7, 3.0)) == (3.0, 3.0)


@pytest.mark.parametrize(
    "values, level, expected",
    [
        # two questions: a resample's mean is 0, 1/2 or 1 with chances 1/4, 1/2, 1/4: both tails lie on the extremes
        ([0.0, 1.0], 0.95, (0.0, 1.0)),
        # [0, 0, 3]: the mean is the number of 3s drawn, Binomial(3, 1/3): P(<= 2) = 26/27 = 0.963, so the 97.5 %
        # quantile is 3 and the 95 % one is 2; P(0) = 8/27 > 0.05, so the low quantiles are 0
        ([0.0, 0.0, 3.0], 0.95, (0.0, 3.0)),
        ([0.0, 0.0, 3.0], 0.90, (0.0, 2.0)),
    ],
)
def test_the_interval_on_cases_computed_by_hand(values, level, expected):
    assert bootstrap_interval(np.array(values), resamples=20_000, seed=3, level=level) == expected


def test_the_interval_holds_the_mean_and_is_reproducible():
    rng = np.random.default_rng(0)
    for _ in range(5):
        values = rng.normal(1.0, 5.0, size=300)
        low, high = bootstrap_interval(values, resamples=2000, seed=1)
        assert low < values.mean() < high
        # about two standard errors on either side
        assert 0.7 < (high - low) / (2 * 1.96 * values.std() / np.sqrt(values.size)) < 1.3
        assert bootstrap_interval(values, resamples=2000, seed=1) == (low, high)


def test_paired_differences_average_each_questions_difference_over_the_seeds():
    scores = np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])  # seeds x questions
    baseline = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 1.0]])
    assert paired_differences(scores, baseline).tolist() == [0.5, 0.5, -0.5]
    with pytest.raises(ValueError, match="equal S x Q"):
        paired_differences(scores, baseline[:1])


QUESTIONS = ["q1", "q2", "q3", "q4"]
CORRECT = {  # (kind, seed) -> questions answered right; the others get an answer sharing no word with the gold
    ("none", 1): {"q1"},
    ("none", 2): {"q1", "q2"},
    ("cluster", 1): {"q1", "q3"},
    ("cluster", 2): {"q1", "q2", "q3"},
}


def squad_file(path):
    """Article 0 (training, not scored) and article 1 with the four held-out questions."""
    qas = [
        {"id": q, "question": f"what {q}?", "answers": [{"text": f"gold {q}", "answer_start": 0}]} for q in QUESTIONS
    ]
    articles = [{"title": "train", "paragraphs": [{"context": "x", "qas": []}]},
                {"title": "held out", "paragraphs": [{"context": "gold", "qas": qas}]}]  # fmt: skip
    path.write_text(json.dumps({"version": "1.1", "data": articles}))
    return path


def write_runs(root, em_of=None):
    for (kind, seed), right in CORRECT.items():
        run = root / f"article_{kind}_seed{seed}"
        run.mkdir(parents=True)
        predictions = {q: f"gold {q}" if q in right else "zzz" for q in QUESTIONS}
        (run / "valid.pred.json").write_text(json.dumps(predictions))
        em = 100 * len(right) / len(QUESTIONS) if em_of is None else em_of
        summary = {"settings": {"kind": kind, "seed": seed}, "exact_match": em, "f1": em, "device": "test"}
        (run / "summary.json").write_text(json.dumps(summary))
    layer = {"layer": "5", "questions": 4, "outside_window_share": 0.6, "outside_window_paragraph_share": 0.3,
             "outside_window_uniform_share": 0.2, "paragraph_share": 0.35, "uniform_share": 0.2}  # fmt: skip
    hybrid = {**layer, "layer": "6", "far_gates": [0.1, -0.3], "mean_abs_far_gate": 0.2}  # a hybrid layer's gates
    reach = {"rows": [{"layer": "sliding window", "paragraph_share": 0.4}, layer, hybrid]}
    (root / "article_cluster_seed1" / "reach.json").write_text(json.dumps(reach))
    # a gate ablation of article_cluster_seed1 (its predictions: q1, q3 right) on q1..q3; the as-trained answer to q2
    # differs from the prediction file's, as a batching tie could make it
    closed = {"as_trained": 66.7, "gates_at_0": 33.3, "difference": -33.3, "interval": [-100.0, 0.0]}
    ablation = {"questions": 3, "answers_changed": 1, "exact_match": closed, "f1": {**closed, "difference": -30.0},
                "answers": {"as_trained": {"q1": "gold q1", "q2": "other", "q3": "gold q3"},
                            "gates_at_0": {"q1": "gold q1", "q2": "other", "q3": "zzz"}}}  # fmt: skip
    (root / "article_cluster_seed1" / "gate_ablation.json").write_text(json.dumps(ablation))
    shift = {"layer": "encoder.sentence_encoder.layers.5", "refreshes": 3, "banked_states": 500,
             "nearest_cosine": 0.9619, "agreement": 0.3410, "reseeded_nearest_cosine": 0.9786,
             "reseeded_agreement": 0.3544}  # fmt: skip
    (root / "article_cluster_seed2" / "centroid_shift.json").write_text(json.dumps({"layers": [shift]}))


def qa_table(*args):
    command = [sys.executable, "-m", "benchmarks.qa_report.table", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)


def test_the_report_gives_each_kind_its_seeds_and_the_paired_interval(tmp_path):
    write_runs(tmp_path / "runs")
    squad = squad_file(tmp_path / "squad.json")
    proc = qa_table("--results", tmp_path / "runs", "--squad", squad, "--held-out-from", "1",
                    "--markdown", tmp_path / "b.md", "--json", tmp_path / "b.json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "b.md").read_text().splitlines()
    assert "| b. whole articles, sliding windows only (`none`), seeds 1 / 2 | 25.00 / 50.00 (37.50 ± 12.50) | " in (
        "\n".join(lines)
    )
    # per question, cluster - none averaged over the seeds: q3 +100 (both seeds), the others 0: mean +25; a
    # resample's mean is 25 x (the q3 draws), Binomial(4, 1/4): P(<= 2) = 0.949 < 0.975 <= P(<= 3)
    assert (
        "| `cluster` | 1 / 2 | +25.00 [+0.00, +75.00] | +25.00 / +25.00 | +25.00 [+0.00, +75.00] | +25.00 / +25.00 |"
        in lines
    )
    assert "| article_cluster_seed1 | 5 | 4 | 0.600 | 0.300 | 0.200 | 0.400 | - |" in lines  # no hybrid gate
    assert "| article_cluster_seed1 | 6 | 4 | 0.600 | 0.300 | 0.200 | 0.400 | 0.200 |" in lines
    shift_row = "| article_cluster_seed2 | encoder.sentence_encoder.layers.5 | 3 | 500 | 0.962 / 0.341 |"
    shift_row += " 0.979 / 0.354 |"
    assert shift_row in lines  # the next refresh, then the reseeded fit, rounded to 3 digits
    ablation_row = "| article_cluster_seed1 | 3 | 66.70 / 33.30 | -33.30 [-100.00, +0.00] | 66.70 / 33.30 | -30.00 "
    assert ablation_row + "[-100.00, +0.00] | 1 | 2 |" in lines  # 2 of its 3 as-trained answers are the file's
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["questions"] == 4 and report["paired"]["cluster"]["exact_match"]["mean"] == 25.0
    assert report["kinds"]["article"]["cluster"]["exact_match"] == [50.0, 75.0]


def test_the_paired_entry_gives_each_seeds_own_difference():
    """Seeds that disagree: seed 1 gains 2 of 4 questions, seed 2 loses 1; the mean over the seeds hides that, the
    per-seed differences show it, in the order of the seeds."""
    from benchmarks.qa_report.table import paired

    def run(kind, seed, right):
        scores = np.array([100.0 * (q < right) for q in range(4)])  # the first `right` questions answered
        return {"kind": kind, "seed": seed, "scores": {"exact_match": scores, "f1": scores / 2}}

    runs = [run("none", 1, 1), run("hybrid", 1, 3), run("none", 2, 3), run("hybrid", 2, 2), run("hybrid", 3, 4)]
    entry = paired(runs, "none", resamples=200, seed=1)["hybrid"]
    assert entry["seeds"] == [1, 2]  # seed 3 has no baseline
    assert entry["exact_match"]["per_seed"] == [50.0, -25.0] and entry["f1"]["per_seed"] == [25.0, -12.5]
    assert entry["exact_match"]["mean"] == 12.5


def test_a_series_can_take_its_baseline_runs_from_another_results_folder(tmp_path):
    write_runs(tmp_path / "first")
    series = tmp_path / "series"
    shutil.copytree(tmp_path / "first" / "article_cluster_seed1", series / "article_cluster_seed1")
    squad = squad_file(tmp_path / "squad.json")
    args = ["--squad", squad, "--held-out-from", "1", "--json", tmp_path / "b.json", "--markdown", tmp_path / "b.md"]
    proc = qa_table("--results", series, "--baseline-from", tmp_path / "first", *args)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    # seed 1: cluster answers q1, q3, none q1; the cluster run of seed 2 in "first" is not read
    assert report["paired"]["cluster"]["seeds"] == [1] and report["paired"]["cluster"]["exact_match"]["mean"] == 25.0
    assert report["kinds"]["article"]["none"]["seeds"] == [1, 2] and report["baseline_from"] == str(tmp_path / "first")
    assert f"The `none` runs are those of `{tmp_path / 'first'}`." in (tmp_path / "b.md").read_text()
    refused = qa_table("--results", tmp_path / "first", "--baseline-from", tmp_path / "first", *args)
    assert refused.returncode == 1 and "has none runs of its own" in refused.stderr


def test_the_seeds_of_one_budget_can_lie_in_several_results_folders(tmp_path):
    """A third seed collected into a folder of its own is pooled with the first two; KIND=DIR takes one kind of a
    folder, and a kind and seed given twice is refused, naming both folders."""
    write_runs(tmp_path / "first")
    third = tmp_path / "third"
    for kind, right in (("none", {"q4"}), ("cluster", {"q3", "q4"})):  # seed 3: cluster gains q3
        run = third / f"article_{kind}_seed3"
        run.mkdir(parents=True)
        (run / "valid.pred.json").write_text(json.dumps({q: f"gold {q}" if q in right else "zzz" for q in QUESTIONS}))
        em = 100 * len(right) / len(QUESTIONS)
        (run / "summary.json").write_text(json.dumps({"settings": {"kind": kind, "seed": 3}, "exact_match": em,
                                                      "f1": em, "device": "test"}))  # fmt: skip
    squad = squad_file(tmp_path / "squad.json")
    args = ["--squad", squad, "--held-out-from", "1", "--json", tmp_path / "b.json"]
    proc = qa_table("--results", tmp_path / "first", third, *args)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads((tmp_path / "b.json").read_text())["paired"]["cluster"]
    assert entry["seeds"] == [1, 2, 3] and entry["exact_match"]["per_seed"] == [25.0, 25.0, 25.0]
    proc = qa_table("--results", f"none={tmp_path / 'first'}", third, *args)  # the first folder's none runs only
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "b.json").read_text())["paired"]["cluster"]["seeds"] == [3]
    refused = qa_table("--results", tmp_path / "first", tmp_path / "first", *args)
    assert refused.returncode == 1 and "are both ('article', 'cluster', 1)" in refused.stderr, refused.stderr


def test_a_run_scored_on_other_questions_is_refused(tmp_path):
    write_runs(tmp_path / "runs", em_of=30.0)
    proc = qa_table("--results", tmp_path / "runs", "--squad", squad_file(tmp_path / "s.json"), "--held-out-from", 1)
    assert proc.returncode == 1 and "summary.json: exact_match 30.0000, but" in proc.stderr
