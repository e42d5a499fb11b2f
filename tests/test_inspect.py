"""Cluster statistics (pure functions, against brute-force definitions) and fairseq-clusterformer-inspect on a model
trained by the real fairseq-train."""

import re

import pytest
import torch
from matplotlib import image

from fairseq_clusterformer.ops import cluster_stats as stats
from fairseq_clusterformer.ops.clustering import gather_tokens, stable_sort
from fairseq_clusterformer.ops.window_scheme import WindowScheme
from tests.conftest import PACKAGE, SLICE, run_cli, run_ok


def layout_pairs(ids, size, stride, band, causal=True):
    """attended_pairs for a sequence sorted by ``ids`` (1 x T), laid out exactly as the layers lay it out."""
    length = ids.size(1)
    valid = torch.ones_like(ids, dtype=torch.bool)
    sorted_ids, order = stable_sort(ids)
    scheme = WindowScheme(size, stride, length, band=band)
    allowed = scheme.mask(order, gather_tokens(valid, order), causal, sorted_ids)
    slots = scheme.slot_positions(order)
    return stats.attended_pairs(scheme.queries(slots), scheme.keys(slots, -1), allowed, length, valid)[0]


def brute_overlap_pairs(ids, size, stride, causal=True):
    """Windows [k*m, k*m + l) of the stably sorted sequence; i sees j if some window holds both (and j <= i)."""
    length = ids.size(1)
    order = sorted(range(length), key=lambda t: (int(ids[0, t]), t))
    pairs = torch.zeros(length, length, dtype=torch.bool)
    for start in range(0, length, stride):
        members = order[start : start + size]
        for i in members:
            for j in members:
                pairs[i, j] |= j <= i or not causal
    return pairs


@pytest.mark.parametrize("length", [1, 7, 24, 37])
def test_sliding_window_pairs_are_the_windows_that_hold_both_tokens(length):
    ids = torch.zeros(1, length, dtype=torch.long)  # one cluster: the sorted order is the original order
    assert torch.equal(layout_pairs(ids, 8, 4, band=False), brute_overlap_pairs(ids, 8, 4))
    distances = stats.attention_distances(layout_pairs(ids, 8, 4, band=False))
    assert distances.min() >= 0 and distances.max() <= stats.window_reach(8)


@pytest.mark.parametrize("seed", range(4))
def test_paper_mode_pairs_follow_windows_of_the_sorted_sequence(seed):
    ids = torch.randint(0, 5, (1, 41), generator=torch.Generator().manual_seed(seed))
    assert torch.equal(layout_pairs(ids, 8, 4, band=False), brute_overlap_pairs(ids, 8, 4))


@pytest.mark.parametrize("seed", range(4))
def test_strict_mode_pairs_are_the_most_recent_predecessors_of_the_same_cluster(seed):
    size, length = 6, 40
    ids = torch.randint(0, 4, (1, length), generator=torch.Generator().manual_seed(seed))
    expected = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        same = [j for j in range(i + 1) if ids[0, j] == ids[0, i]]
        for j in same[-size:]:  # itself and its size - 1 most recent predecessors
            expected[i, j] = True
    assert torch.equal(layout_pairs(ids, size, 3, band=True), expected)


def test_pads_never_appear_in_the_pairs_and_distances_count_every_pair():
    q_pos = torch.tensor([[[0, 1, 2, 3]]])  # 1 x 1 x 4 (slot 3 is a pad position, outside length 3)
    allowed = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    valid = torch.tensor([[True, True, False]])
    pairs = stats.attended_pairs(q_pos, q_pos, allowed, 3, valid)[0]
    assert pairs.tolist() == [[True, True, False], [True, True, False], [False, False, False]]
    assert sorted(stats.attention_distances(pairs).tolist()) == [-1, 0, 0, 1]


def test_cluster_sizes_members_and_reach():
    ids = torch.tensor([[2, 0, 2, 3, 2, 0, 4, 4]])  # P = 4: id 4 is a pad
    sizes = stats.cluster_sizes(ids, 4)
    assert sizes.tolist() == [2, 0, 3, 1]
    assert stats.largest_clusters(sizes, 3) == [2, 0, 3]
    assert stats.largest_clusters(sizes, 10) == [2, 0, 3]  # empty clusters are never listed
    assert stats.cluster_positions(ids[0], 2).tolist() == [0, 2, 4]
    assert stats.window_reach(64) == 63 and stats.window_reach(64, 3) == 189
    assert stats.fraction_beyond(torch.tensor([0, 10, 63, 64]), 63) == 0.25
    assert stats.fraction_beyond(torch.tensor([], dtype=torch.long), 63) == 0.0


@pytest.fixture(scope="module")
def trained_checkpoint(lm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("inspect_ckpt")
    flags = (
        "--task clusterformer_lm --arch clusterformer_lm_tiny --tokens-per-sample 256 --sample-break-mode none "
        "--optimizer adam --lr 0.003 --batch-size 4 --max-update 10 --memory-size 2000 --kmeans-iters 5 "
        "--cluster-update-interval 3 --num-workers 0 --no-epoch-checkpoints --cluster-causality paper"
    )
    run_ok("fairseq-train", lm_data, "--user-dir", PACKAGE, "--save-dir", save, *flags.split())
    return save / "checkpoint_last.pt"


@pytest.mark.e2e
def test_inspect_prints_real_positions_of_the_words_and_writes_a_png(trained_checkpoint, lm_data, tmp_path):
    document = SLICE / "test.txt"
    png = tmp_path / "figure" / "clusters.png"
    where = ["--path", trained_checkpoint, "--data", lm_data, "--document", document, "--png", png]
    out = run_ok("fairseq-clusterformer-inspect", *where, "--clusters", "3", "--max-words", "25")
    words = []  # the document as fairseq-preprocess reads it: words, then one end-of-line token per line
    for line in document.read_text(encoding="utf-8").splitlines():
        words += [*line.split(), "</s>"]
    blocks = re.split(r"\n(?=layer \d+ )", out)[1:]
    assert [b.split(" ")[1] for b in blocks] == ["2", "4"], out[-3000:]  # the two long-range layers of the tiny arch
    for block in blocks:
        header = re.match(r"layer \d+ \(ClusterFormerLayer\): (\d+) tokens in (\d+) of 16 clusters", block)
        assert header and int(header.group(1)) == 256, block
        shown = re.findall(r"    words: (.*)\n    positions: (.*)(?:\n|$)", block)
        assert len(shown) == min(3, int(header.group(2))), block  # the three largest non-empty clusters
        for word_line, position_line in shown:
            printed = word_line.split(" (+")[0].split()
            positions = [int(p) for p in position_line.split(" (+")[0].split(", ")]
            assert len(printed) == len(positions) > 0
            assert positions == sorted(positions) and positions[-1] < 256
            assert printed == [words[p] for p in positions], "a printed word is not at its printed position"
    picture = image.imread(png)  # decodes the file: a valid PNG
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert picture.ndim == 3 and picture.shape[0] > 100 and picture.shape[1] > 100


@pytest.mark.e2e
def test_inspect_names_the_missing_file_or_bad_flag(trained_checkpoint, lm_data, tmp_path):
    png = ["--png", tmp_path / "x.png"]
    document = ["--document", SLICE / "test.txt"]
    inspect = "fairseq-clusterformer-inspect"
    code, out = run_cli(
        inspect, "--path", trained_checkpoint, "--data", lm_data, "--document", tmp_path / "no.txt", *png
    )
    assert code == 2 and "--document" in out and "no.txt" in out
    code, out = run_cli(inspect, "--path", tmp_path / "none.pt", "--data", lm_data, *document, *png)
    assert code == 2 and "--path" in out and "none.pt" in out
    code, out = run_cli(inspect, "--path", trained_checkpoint, "--data", lm_data, *document, *png, "--show", "99")
    assert code == 2 and "--show 99" in out
    assert not (tmp_path / "x.png").exists()
