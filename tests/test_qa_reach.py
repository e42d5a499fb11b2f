"""fairseq-clusterformer-qa-reach: the span statistic against a brute-force loop over a window layout, and the real
console script on tiny QA checkpoints (Cluster-Former and sliding-window only), checked against values computed
here from the binarised data alone."""

import json
import math
import subprocess
import sys
from itertools import product
from pathlib import Path

import numpy as np
import pytest
import torch

from fairseq_clusterformer.layers.hybrid import GATE_GAIN
from fairseq_clusterformer.ops import cluster_stats as stats
from fairseq_clusterformer.ops.clustering import cluster_size_entropy
from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit
from tests.conftest import REPO, run_cli, run_ok
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_end_to_end import TRAIN


def loop_counts(q_pos, k_pos, allowed, valid, queries, *inside):
    """The pairs a layout lets attend, found by visiting every slot of every window, then counted per batch row."""
    bsz, windows, lq = q_pos.shape
    length = valid.size(1)
    seen = set()
    for b, k, i, j in product(range(bsz), range(windows), range(lq), range(k_pos.size(2))):
        q, key = int(q_pos[b, k, i]), int(k_pos[b, k, j])
        if 0 <= q < length and 0 <= key < length and allowed[b, k, i, j] and valid[b, q] and valid[b, key]:
            seen.add((b, q, key))
    counts = [0] * bsz
    for b, q, key in seen:
        ok = all(keys[b, key] if keys.dim() == 2 else keys[b, q, key] for keys in inside)
        counts[b] += bool(queries[b, q] and ok)
    return counts


@pytest.mark.parametrize("seed", range(8))
def test_keys_inside_counts_the_layouts_pairs_as_a_loop_does(seed):
    g = torch.Generator().manual_seed(seed)
    bsz, windows, lq, lk, length = 2, 3, 4, 5, 9
    # positions anywhere in [-1, length]: -1 and length are padded slots; windows overlap, so pairs repeat
    q_pos = torch.randint(-1, length + 1, (bsz, windows, lq), generator=g)
    k_pos = torch.randint(-1, length + 1, (bsz, windows, lk), generator=g)
    allowed = torch.rand(bsz, windows, lq, lk, generator=g) < 0.6
    valid = torch.rand(bsz, length, generator=g) < 0.85
    queries = torch.rand(bsz, length, generator=g) < 0.5
    per_key = torch.rand(bsz, length, generator=g) < 0.5  # one key set for every query
    per_query = torch.rand(bsz, length, length, generator=g) < 0.5  # a key set per query
    pairs = stats.attended_pairs(q_pos, k_pos, allowed, length, valid)
    # only some query rows, as the script asks for them (position 0, never asked for, holds real queries)
    rows = torch.tensor([6, 1, 4])
    sub = stats.attended_rows(q_pos, k_pos, allowed, length, rows, valid)
    assert torch.equal(sub, pairs[:, rows])
    asked = queries & torch.isin(torch.arange(length), rows)
    sets = [[], [per_key], [per_query], [per_key, per_query]]
    expected = [loop_counts(q_pos, k_pos, allowed, valid, queries, *inside) for inside in sets]
    assert stats.keys_inside(pairs, queries, sets).t().tolist() == expected
    sub_sets = [[keys if keys.dim() == 2 else keys[:, rows] for keys in inside] for inside in sets]
    expected = [loop_counts(q_pos, k_pos, allowed, valid, asked, *inside) for inside in sets]
    assert stats.keys_inside(sub, queries[:, rows], sub_sets).t().tolist() == expected


def test_keys_inside_on_a_hand_made_layout():
    # one window [0, 1, 2] and one [2, 3, 4] (slot 4 padded); query 2 sits in both and sees keys 0..3 once each
    q_pos = torch.tensor([[[0, 1, 2], [2, 3, 9]]])
    allowed = torch.ones(1, 2, 3, 3, dtype=torch.bool)
    pairs = stats.attended_pairs(q_pos, q_pos, allowed, 5)
    query_2 = torch.tensor([[False, False, True, False, False]])
    span = stats.span_mask(5, [(3, 5)]).unsqueeze(0)  # keys 3 and 4
    assert stats.keys_inside(pairs, query_2, [[], [span]]).tolist() == [[4, 1]]


def test_paragraphs_spans_and_size_summary():
    starts = [0, 4, 9]
    assert stats.paragraphs_of(starts, 12, [5]) == [(4, 9)]
    assert stats.paragraphs_of(starts, 12, [11, 2, 10]) == [(0, 4), (9, 12)]
    assert stats.paragraphs_of([3], 12, [1]) == []  # before the first marker: no paragraph
    assert stats.span_mask(6, [(1, 3), (2, 4)]).tolist() == [False, True, True, True, False, False]
    with pytest.raises(ValueError, match="does not fit"):
        stats.span_mask(4, [(2, 5)])
    ids = torch.tensor([0, 0, 0, 2, 2, 5])
    entropy, largest, empty = stats.size_summary(stats.cluster_sizes(ids, 8))
    assert entropy == pytest.approx(float(cluster_size_entropy(ids[None], 8)), abs=1e-6)
    assert (largest, empty) == (0.5, 5)
    assert stats.size_summary(torch.full((8,), 3))[0] == pytest.approx(3.0)
    assert stats.size_summary(torch.tensor([7, 0, 0])) == (0.0, 1.0, 2)


# --------------------------------------------------------------------------------------------------------------------
# the real console script on tiny checkpoints

QUICK = ["--max-update", "12", "--disable-validation", "--cluster-update-interval", "6", "--memory-size", "600"]


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


def train(qa_data, tmp_path_factory, kind, *extra):
    save_dir = tmp_path_factory.mktemp(f"qa_reach_{kind}")
    # TRAIN's own --memory-size / --cluster-update-interval come first: the later ones below win
    run_ok("fairseq-train", qa_data, *TRAIN, *QUICK, "--long-range-layer", kind, "--save-dir", save_dir, *extra)
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def reports(qa_data, tmp_path_factory):
    out = {}
    for name, kind, extra in [("cluster", "cluster", ()), ("none", "none", ()),
                              ("hybrid", "cluster", ("--long-range-mode", "hybrid"))]:  # fmt: skip
        checkpoint = train(qa_data, tmp_path_factory, kind, *extra)
        path = checkpoint.parent / "reach.json"
        printed = run_ok("fairseq-clusterformer-qa-reach", qa_data, "--path", checkpoint, "--json", path, "--cpu")
        out[name] = (json.loads(path.read_text()), printed)
    return out


def expected_shares(qa_data, size, stride):
    """Per question, from the binarised files alone: (gold paragraph length / context length, the share of the
    sliding window's context keys in that paragraph): the question copy of window k sees context k*m .. k*m+l-1."""
    split = QABinarizedSplit(str(qa_data), "valid")
    uniform, window = [], []
    for i in range(len(split)):
        meta, n = split.metas[i], int(split.context_sizes[i])
        starts = meta["paragraph_starts"] + [n]
        para = [(a, b) for a, b in zip(starts, starts[1:]) if any(a <= s < b for s, _ in meta["spans"])]
        inside = lambda p: any(a <= p < b for a, b in para)  # noqa: E731
        uniform.append(sum(b - a for a, b in para) / n)
        keys = [p for k in range(math.ceil((n + 1) / stride)) for p in range(k * stride, k * stride + size) if p < n]
        window.append(sum(map(inside, keys)) / len(keys))
    return float(np.mean(uniform)), float(np.mean(window))


@pytest.mark.e2e
def test_reach_reports_shares_for_cluster_and_sliding_window_checkpoints(reports, qa_data):
    cluster, printed = reports["cluster"]
    none, printed_none = reports["none"]
    uniform, window_share = expected_shares(qa_data, cluster["window_size"], cluster["window_stride"])
    for report in (cluster, none):
        assert report["questions"] == 40 and report["left_out"] == {"no_gold_answer_in_context": 0}
        assert report["uniform_paragraph_share"] == pytest.approx(uniform, abs=1e-9)
        window = report["rows"][0]
        assert window["kind"] == "sliding_window" and window["layers"] == ("1,2,3,4" if report is none else "1,3")
        assert window["paragraph_share"] == pytest.approx(window_share, abs=1e-9)
        # what the sliding window sees is its own window: nothing outside it, exactly
        assert window["outside_window_share"] == 0.0 and window["outside_window_questions"] == 0
    assert none["long_range_layer"] == "none" and len(none["rows"]) == 1
    assert "no long-range layer" in printed_none
    assert cluster["long_range_layer"] == "cluster"
    layers = cluster["rows"][1:]
    assert [row["layer"] for row in layers] == ["2", "4"] and {row["kind"] for row in layers} == {"cluster"}
    for row in layers:
        assert row["questions"] == 40
        assert row["uniform_share"] == pytest.approx(uniform, abs=1e-9)
        for key in ("paragraph_share", "outside_window_share", "outside_window_paragraph_share", "largest_share"):
            assert 0.0 <= row[key] <= 1.0, (key, row)
        # sorted windows of 32 over ~10 question copies and 100-400 context tokens: question tokens meet keys of
        # other windows
        assert row["outside_window_share"] > 0.0
        assert 0.0 <= row["entropy_bits"] <= row["max_entropy_bits"] == pytest.approx(4.0)
        assert 0.0 <= row["empty_clusters"] <= 16 and row["clusters"] == 16
    assert "in answer par." in printed and "cluster" in printed
    assert all("far_gates" not in row for row in cluster["rows"]) and "hybrid" not in printed


@pytest.mark.e2e
def test_reach_reports_the_gates_of_hybrid_layers(reports):
    """A hybrid layer's row has its heads' gates, read from the checkpoint: opened by training from 0 (the gate gets
    a gradient from the first update), each within (-1, 1)."""
    hybrid, printed = reports["hybrid"]
    layers = hybrid["rows"][1:]
    assert [row["layer"] for row in layers] == ["2", "4"]
    for row in layers:
        state = torch.load(hybrid["checkpoint"], map_location="cpu", weights_only=False)["model"]
        raw = state[f"encoder.sentence_encoder.layers.{int(row['layer']) - 1}.long_range_gate"]
        assert row["far_gates"] == pytest.approx(torch.tanh(GATE_GAIN * raw.float()).tolist(), abs=1e-6)
        assert len(row["far_gates"]) == 4 and all(-1.0 < g < 1.0 for g in row["far_gates"])
        assert 0.0 < row["mean_abs_far_gate"] < 1.0
        assert row["outside_window_share"] > 0.0
        assert f"layer {row['layer']} (hybrid): far attention added per head" in printed


@pytest.mark.e2e
def test_reach_rejects_bad_input_naming_the_flag(qa_data, tmp_path):
    missing = tmp_path / "missing.pt"
    code, out = run_cli("fairseq-clusterformer-qa-reach", qa_data, "--path", missing)
    assert code != 0 and "--path" in out and "Traceback" not in out
    code, out = run_cli("fairseq-clusterformer-qa-reach", qa_data, "--path", missing, "--max-examples", "0")
    assert code != 0 and "--max-examples" in out and "Traceback" not in out


def with_gates(checkpoint: Path, dest: Path, raw: float) -> Path:
    """A copy of ``checkpoint`` whose hybrid layers' gates all hold ``raw`` (each head adds tanh(GATE_GAIN * raw) of
    its far attention)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    gates = [key for key in state["model"] if key.endswith("long_range_gate")]
    assert gates, "the hybrid fixture has gates"
    for key in gates:
        state["model"][key].fill_(raw)
    torch.save(state, dest)
    return dest


@pytest.mark.e2e
def test_gate_ablation_scores_as_trained_and_with_the_gates_closed(reports, qa_data, tmp_path):
    """benchmarks/qa_gate_ablation.py: its two passes answer as qa-predict answers for the checkpoint and for a copy
    of it whose gates are 0; with the gates opened wide (tanh(1) = 0.76) closing them changes answers; a checkpoint
    without hybrid layers is refused, naming --path."""
    hybrid = Path(reports["hybrid"][0]["checkpoint"])
    opened = with_gates(hybrid, tmp_path / "opened.pt", 1.0 / GATE_GAIN)
    closed = with_gates(hybrid, tmp_path / "closed.pt", 0.0)
    script = [sys.executable, "-m", "benchmarks.qa_gate_ablation", qa_data, "--cpu", "--max-examples", "24"]
    proc = subprocess.run([*script, "--path", opened, "--json", tmp_path / "a.json"], capture_output=True, text=True,
                          cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["questions"] == 24
    for checkpoint, label in ((opened, "as_trained"), (closed, "gates_at_0")):
        out = tmp_path / f"{label}.pred.json"
        run_ok("fairseq-clusterformer-qa-predict", qa_data, "--path", checkpoint, "--output", out, "--cpu")
        predicted = json.loads(out.read_text())
        assert report["answers"][label] == {q: predicted[q] for q in report["answers"][label]}, label
    changed = sum(report["answers"]["as_trained"][q] != a for q, a in report["answers"]["gates_at_0"].items())
    assert report["answers_changed"] == changed > 0
    for metric in ("exact_match", "f1"):
        row = report[metric]
        assert row["difference"] == pytest.approx(row["gates_at_0"] - row["as_trained"])
        assert row["interval"][0] <= row["difference"] <= row["interval"][1]
    cluster = reports["cluster"][0]["checkpoint"]
    proc = subprocess.run([*script, "--path", cluster], capture_output=True, text=True)
    assert proc.returncode != 0 and "--path" in proc.stderr and "no hybrid long-range layer" in proc.stderr
