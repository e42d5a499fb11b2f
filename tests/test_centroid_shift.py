"""How far a K-Means refresh moved the centroids (ops/centroid_shift.py), and the refresher reporting it."""

import itertools
import json
import logging
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from fairseq.logging import metrics

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.ops.centroid_shift import adjusted_rand_index, nearest_cosine
from fairseq_clusterformer.ops.clustering import nearest_ids
from fairseq_clusterformer.ops.kmeans import order_centroids, spherical_kmeans
from fairseq_clusterformer.refresh.kmeans_job import LayerResult
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings
from tests.conftest import REPO

C = 16


def pair_counting_ari(first: list[int], second: list[int]) -> float:
    """The adjusted Rand index from its definition over pairs (Hubert and Arabie's pair form), one pair at a time:
    a = together in both, b = together in the first only, c = in the second only, d = apart in both."""
    a = b = c = d = 0
    for i, j in itertools.combinations(range(len(first)), 2):
        same_first, same_second = first[i] == first[j], second[i] == second[j]
        a += same_first and same_second
        b += same_first and not same_second
        c += same_second and not same_first
        d += not same_first and not same_second
    return 2 * (a * d - b * c) / ((a + b) * (b + d) + (a + c) * (c + d))


@pytest.mark.parametrize("seed", range(5))
def test_adjusted_rand_index_equals_the_pair_counting_definition(seed):
    gen = torch.Generator().manual_seed(seed)
    first = torch.randint(0, 4, (40,), generator=gen)
    # the second labelling agrees with the first on about half the items, and has another number of clusters
    second = torch.where(torch.rand(40, generator=gen) < 0.5, first, torch.randint(0, 6, (40,), generator=gen))
    got = adjusted_rand_index(first, second, 4, 6)
    assert got == pytest.approx(pair_counting_ari(first.tolist(), second.tolist()), abs=1e-12)


def test_adjusted_rand_index_ignores_the_names_of_the_clusters_and_scores_independence_near_zero():
    labels = torch.arange(5).repeat(20)  # 100 items, 5 clusters
    renamed = (labels * 3 + 1) % 5  # a permutation of the names
    assert adjusted_rand_index(labels, renamed, 5, 5) == 1.0
    gen = torch.Generator().manual_seed(0)
    big = torch.randint(0, 8, (20000,), generator=gen)
    unrelated = torch.randint(0, 8, (20000,), generator=gen)
    assert abs(adjusted_rand_index(big, unrelated, 8, 8)) < 0.01
    # every item in one cluster in both: no pair disagrees
    assert adjusted_rand_index(torch.zeros(6, dtype=torch.long), torch.zeros(6, dtype=torch.long), 1, 1) == 1.0
    with pytest.raises(ValueError, match="different sizes"):
        adjusted_rand_index(labels, labels[:-1], 5, 5)


def planted(seed: int, clusters: int = 4, per_cluster: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, C) noisy unit states around `clusters` random directions, and those directions."""
    gen = torch.Generator().manual_seed(seed)
    directions = F.normalize(torch.randn(clusters, C, generator=gen), dim=-1)
    labels = torch.arange(clusters).repeat_interleave(per_cluster)
    return F.normalize(directions[labels] + 0.1 * torch.randn(len(labels), C, generator=gen), dim=-1), directions


def partition_agreement(states: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> float:
    return adjusted_rand_index(nearest_ids(states, old), nearest_ids(states, new), old.size(0), new.size(0))


def test_centroids_that_are_the_old_ones_reordered_did_not_move():
    states, directions = planted(1)
    reordered = directions[torch.tensor([2, 0, 3, 1])]
    assert nearest_cosine(directions, reordered) == pytest.approx(1.0)
    assert partition_agreement(states, directions, reordered) == 1.0
    # other directions altogether: the new centroids are far from every old one, and the states regroup
    _, elsewhere = planted(2)
    assert nearest_cosine(directions, elsewhere) < 0.9
    assert partition_agreement(states, directions, elsewhere) < 0.9


def test_nearest_ids_do_not_depend_on_the_chunk_size():
    states, directions = planted(3)
    assert torch.equal(nearest_ids(states, directions, rows=7), nearest_ids(states, directions, rows=1000))
    assert torch.equal(nearest_ids(states, directions), torch.arange(4).repeat_interleave(100))


def test_a_result_saved_before_the_shift_was_measured_loads_without_it():
    saved = LayerResult(torch.eye(4, C), 400, 0.1, backend="torch").state_dict()
    for key in ("nearest_cosine", "agreement"):
        saved.pop(key)
    loaded = LayerResult.from_state_dict(saved)
    assert loaded.nearest_cosine is None and loaded.agreement is None and loaded.shift_note() == ""


def test_the_refresher_logs_how_far_each_refresh_moved_the_centroids(caplog):
    torch.manual_seed(0)
    layer = ClusterFormerLayer(LayerSettings(C, 32, 2, 6, 3), 4).train()
    refresher = CentroidRefresher(RefreshSettings(memory_size=400, interval=1, iters=10, backend="torch"))
    refresher.attach(layer)

    def refresh_on(states: torch.Tensor, update: int) -> tuple[float, float]:
        layer(states.unsqueeze(0))  # 1 x N x C: the whole bank in one forward
        refresher.commit()
        banked, before = refresher.banks[0].contents().clone(), layer.centroids.clone()
        with caplog.at_level(logging.INFO):
            refresher.before_step(update)
        with metrics.aggregate(new_root=True) as agg:
            refresher.log_stats()
        logged = agg.get_smoothed_values()
        # what was logged is the shift between the centroids before and after, measured on the banked states
        assert logged["kmeans_cos_0"] == pytest.approx(nearest_cosine(before, layer.centroids), abs=5e-4)
        assert logged["kmeans_ari_0"] == pytest.approx(partition_agreement(banked, before, layer.centroids), abs=5e-4)
        return logged["kmeans_cos_0"], logged["kmeans_ari_0"]

    states, _ = planted(4)
    with metrics.aggregate(new_root=True) as agg:
        refresher.log_stats()
    assert "kmeans_ari_0" not in agg.get_smoothed_values()  # nothing refreshed yet, nothing to report
    first = refresh_on(states, 1)  # against the random initial centroids
    again = refresh_on(states, 2)  # the same states: K-Means (another seed) finds nearly the same clusters
    moved = refresh_on(planted(5)[0], 3)  # states around other directions: the clusters move
    assert again[0] > 0.9 and again[1] > 0.9
    assert first[1] < 0.5 and moved[0] < 0.5 and moved[1] < 0.5
    assert refresher.layer_refreshes == [3]
    assert caplog.text.count("the banked states' clusters agree at adjusted Rand") == 3


OLD_LM = REPO / "tests" / "data" / "old_checkpoints" / "lm" / "checkpoint_last.pt"  # two Cluster-Former layers


def centroid_shift(checkpoint, *args):
    script = [sys.executable, "-m", "benchmarks.centroid_shift", checkpoint, *args]
    return subprocess.run(script, capture_output=True, text=True, cwd=REPO, timeout=300)


def test_the_checkpoint_script_runs_the_next_refresh_on_the_saved_banks(tmp_path):
    proc = centroid_shift(OLD_LM, "--json", tmp_path / "shift.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "shift.json").read_text())
    # by hand: the banks' rows oldest first (a full ring starts at its write position), K-Means seeded as the next
    # refresh (--seed 3 plus the 2 refreshes started), against the decoder's installed centroids in layer order
    checkpoint = torch.load(OLD_LM, map_location="cpu", weights_only=False)
    state = checkpoint["extra_state"]["ClusterFormerLMTask"]["centroid_refresh"]
    assert report["kmeans_seed"] == 3 + state["refreshes_started"] == 5
    assert [row["layer"] for row in report["layers"]] == ["decoder.layers.1", "decoder.layers.3"]
    for row, bank in zip(report["layers"], state["banks"]):
        start = bank["pos"] if bank["size"] == bank["capacity"] else 0
        rows = bank["buffer"][(start + torch.arange(bank["size"])) % bank["capacity"]]  # N x C, oldest first
        installed = checkpoint["model"][f"{row['layer']}.centroids"]
        fresh = order_centroids(spherical_kmeans(rows, installed.size(0), 20, 5, "torch"))
        ids = (F.normalize(rows, dim=-1) @ F.normalize(installed.float(), dim=-1).t()).argmax(dim=-1)  # N
        fresh_ids = (F.normalize(rows, dim=-1) @ fresh.t()).argmax(dim=-1)  # N
        assert row["banked_states"] == bank["size"] and row["refreshes"] == 2
        assert row["agreement"] == pytest.approx(pair_free_ari(ids, fresh_ids), abs=1e-9)
        assert row["nearest_cosine"] == pytest.approx(nearest_cosine(installed, fresh), abs=1e-6)
        assert -1 < row["reseeded_agreement"] <= 1 and row["reseeded_nearest_cosine"] <= 1 + 1e-6
        assert f"| {row['layer']} | 2 | {bank['size']} | {row['nearest_cosine']:.3f} / {row['agreement']:.3f} |" in (
            proc.stdout
        )


def pair_free_ari(first: torch.Tensor, second: torch.Tensor) -> float:
    """The adjusted Rand index from the pair counts of the contingency table, written out with Python integers."""
    table: dict[tuple[int, int], int] = {}
    for a, b in zip(first.tolist(), second.tolist()):
        table[a, b] = table.get((a, b), 0) + 1
    rows: dict[int, int] = {}
    cols: dict[int, int] = {}
    for (a, b), n in table.items():
        rows[a] = rows.get(a, 0) + n
        cols[b] = cols.get(b, 0) + n

    def pairs(n: int) -> int:
        return n * (n - 1) // 2

    index = sum(map(pairs, table.values()))
    row_pairs, col_pairs, total = sum(map(pairs, rows.values())), sum(map(pairs, cols.values())), pairs(len(first))
    expected = row_pairs * col_pairs / total
    return (index - expected) / ((row_pairs + col_pairs) / 2 - expected)


def test_the_checkpoint_script_refuses_a_checkpoint_without_banks(tmp_path):
    checkpoint = torch.load(OLD_LM, map_location="cpu", weights_only=False)
    del checkpoint["extra_state"]["ClusterFormerLMTask"]["centroid_refresh"]["banks"]  # a checkpoint saved without them
    torch.save(checkpoint, tmp_path / "checkpoint_best.pt")
    proc = centroid_shift(tmp_path / "checkpoint_best.pt")
    assert proc.returncode == 2 and "holds no memory banks" in proc.stderr
    assert centroid_shift(tmp_path / "missing.pt").returncode == 2
