"""The K-Means refresh's life around training: a job still running when training ends is joined and its error
reported (also under --no-save), the memory banks travel in checkpoint_last.pt only, the initial centroids come from
rank 0, and a model without Cluster-Former layers starts no job."""

import inspect
import subprocess
import sys
from argparse import Namespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from fairseq_clusterformer.compat.patches import open_save
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings
from fairseq_clusterformer.refresh.task_hooks import CentroidRefreshHooks
from tests.conftest import PACKAGE, REPO, TINY_LM_TRAIN, run_ok

# ---- a K-Means job still running when training ends is joined and its error reported ------------------------------

# a process that starts a background refresh (installing 5 updates later) and ends right after it, as training would
ENDS_WITH_A_JOB_IN_FLIGHT = """
import logging, sys, time
import torch
from fairseq_clusterformer.refresh import kmeans_job
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.settings import LayerSettings

logging.basicConfig(level=logging.INFO, stream=sys.stdout)

def slow_refresh(*args):
    time.sleep(1.0)  # still running when the main thread returns
    if FAIL:
        raise ValueError("faiss ran out of memory")
    print("K-Means finished its work", flush=True)
    return kmeans_job.LayerResult(None, 0, 1.0, "test")

FAIL = sys.argv[1] == "fail"
kmeans_job.refresh_layer = slow_refresh
layer = ClusterFormerLayer(LayerSettings(8, 16, 2, 4, 2), 4).train()
refresher = CentroidRefresher(RefreshSettings(memory_size=50, interval=1, iters=2, backend="torch", swap_delay=5))
refresher.attach(layer)
for update in range(2):
    refresher.before_step(update)
    layer(torch.randn(2, 6, 8))
    refresher.commit()
print("training loop over", flush=True)
"""


@pytest.mark.parametrize("outcome", ["ok", "fail"])
def test_a_job_in_flight_at_the_end_is_joined_and_its_error_reported(outcome):
    proc = subprocess.run(
        [sys.executable, "-c", ENDS_WITH_A_JOB_IN_FLIGHT, outcome],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert "training loop over" in out, out
    after = out.split("training loop over", 1)[1]  # what happened after the main thread's work was done
    if outcome == "ok":
        assert "K-Means finished its work" in after, out
        assert "training ended before K-Means job 1 (snapshot of update 1) was due for install at update 6" in after
    else:
        assert "K-Means job 1 (snapshot of update 1) failed on its background thread" in after, out
        assert "ValueError('faiss ran out of memory')" in after


@pytest.mark.e2e
def test_fairseq_train_with_no_save_joins_the_last_job(lm_data, tmp_path):
    # a refresh starts at update 3 and would install at update 7: training stops at update 4 with it in flight
    schedule = ["--memory-size", "2000", "--cluster-update-interval", "3", "--kmeans-swap-delay", "4"]
    out = run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, *schedule, "--max-update", "4", "--no-save", cwd=tmp_path)
    assert "K-Means job 1 started at update 3" in out
    assert "training ended before K-Means job 1 (snapshot of update 3) was due for install at update 7: joined" in out
    assert not list(tmp_path.glob("**/*.pt"))


# ---- the memory banks travel in checkpoint_last.pt only -----------------------------------------------------------


def fake_state(rows):
    refresh = {"banks": [{"buffer": torch.randn(rows, 64)}], "num_refreshes": 2}
    return {"model": {"w": torch.arange(10.0)}, "extra_state": {"Task": {"centroid_refresh": refresh}}}


class Task(CentroidRefreshHooks):
    """The K-Means hooks' checkpoint methods, on a task class named as the fake state's entry."""

    gathered = 0

    def before_checkpoint_save(self):
        self.gathered += 1


def test_the_copies_of_a_save_lose_the_banks_and_checkpoint_last_keeps_them(tmp_path):
    """fairseq's save_checkpoint writes one file and copies it onto the others; with the plug-in's patches installed
    (``compat.patches``) every file but checkpoint_last.pt is written without the banks, in one pass."""
    state, task = fake_state(4000), Task()
    first = tmp_path / "checkpoint_1_4.pt"

    def fairseq_save(cfg, trainer, epoch_itr, val_loss):  # what checkpoint_utils.save_checkpoint does, in short
        checkpoint_utils.torch_persistent_save(state, str(first))
        for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
            PathManager.copy(str(first), str(tmp_path / name), overwrite=True)

    open_save(fairseq_save)(Namespace(no_save=False), Namespace(task=task), None, None)

    assert task.gathered == 1  # the ranks' shards merged before the state was taken
    last = torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)
    assert torch.equal(last["extra_state"]["Task"]["centroid_refresh"]["banks"][0]["buffer"],
                       state["extra_state"]["Task"]["centroid_refresh"]["banks"][0]["buffer"])  # fmt: skip
    for name in ("checkpoint_1_4.pt", "checkpoint_best.pt"):
        saved = torch.load(tmp_path / name, weights_only=False)
        assert saved["extra_state"]["Task"]["centroid_refresh"] == {"banks": None, "num_refreshes": 2}
        assert torch.equal(saved["model"]["w"], torch.arange(10.0))
        assert (tmp_path / name).stat().st_size < (tmp_path / "checkpoint_last.pt").stat().st_size // 10
    assert state["extra_state"]["Task"]["centroid_refresh"]["banks"] is not None  # the trainer's state untouched
    # outside a save, a copy is a plain (atomic) copy
    PathManager.copy(str(first), str(tmp_path / "checkpoint_last.pt"), overwrite=True)
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == first.read_bytes()


def refresh_state(path):
    state = torch.load(path, map_location="cpu", weights_only=False)
    return state["extra_state"]["ClusterFormerLMTask"]["centroid_refresh"]


# fairseq 0.12.2 saves only task.state_dict() (the refresh schedule, no banks); the banks reach a checkpoint through
# Task.get_checkpoint_dict, which fairseq-fixed 0.12.3 and fairseq main call
SAVES_TASK_CHECKPOINT_DICT = "get_checkpoint_dict" in inspect.getsource(checkpoint_utils.save_checkpoint)


@pytest.mark.e2e
@pytest.mark.skipif(not SAVES_TASK_CHECKPOINT_DICT, reason="this fairseq saves no memory banks in checkpoints")
def test_fairseq_train_keeps_the_banks_in_checkpoint_last_only(lm_data, tmp_path):
    saves = ["--memory-size", "2000", "--save-interval-updates", "2", "--keep-interval-updates", "-1"]
    run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, *saves, "--max-update", "4", "--save-dir", tmp_path / "s")
    last = tmp_path / "s" / "checkpoint_last.pt"
    banks = refresh_state(last)["banks"]
    bank_bytes = sum(bank["buffer"].numel() * 4 for bank in banks)
    assert len(banks) == 2 and bank_bytes == 2 * 2000 * 64 * 4  # both banks full
    for name in ("checkpoint_1_2.pt", "checkpoint_1_4.pt", "checkpoint_best.pt"):
        path = tmp_path / "s" / name
        assert refresh_state(path)["banks"] is None, name
        assert refresh_state(path)["last_refresh_epoch"] == 1  # the schedule itself is still there
        assert last.stat().st_size - path.stat().st_size > 0.9 * bank_bytes, name
    # the halfway checkpoint with the same model weights as checkpoint_last
    a = torch.load(tmp_path / "s" / "checkpoint_1_4.pt", map_location="cpu", weights_only=False)["model"]
    b = torch.load(last, map_location="cpu", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in b)

    # fine-tuning from the best checkpoint: the banks refill, and the log says so
    best = tmp_path / "s" / "checkpoint_best.pt"
    out = run_ok(
        "fairseq-train", lm_data, *TINY_LM_TRAIN, "--memory-size", "2000", "--max-update", "5",
        "--restore-file", best, "--save-dir", tmp_path / "f",
    )  # fmt: skip
    assert "no memory banks (only checkpoint_last.pt keeps them)" in out
    assert len(refresh_state(tmp_path / "f" / "checkpoint_last.pt")["banks"][0]["buffer"]) == 800  # one batch
    out = run_ok(
        "fairseq-eval-lm", lm_data, "--task", "clusterformer_lm", "--user-dir", PACKAGE, "--path", best,
        "--gen-subset", "test", "--tokens-per-sample", "200", "--batch-size", "4", "--num-workers", "0",
    )  # fmt: skip
    assert "Perplexity:" in out


# ---- initial centroids come from rank 0 ---------------------------------------------------------------------------


def initial_centroids_worker(rank, init_file, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(10 + rank)  # the ranks draw different random centroids, as unequal seeds would
    layer = ClusterFormerLayer(LayerSettings(8, 16, 2, 4, 2), 4).train()
    refresher = CentroidRefresher(RefreshSettings(memory_size=50, interval=100, backend="torch"))
    refresher.attach(layer)
    before = layer.centroids.clone()
    refresher.before_step(0)  # no refresh is due: only the broadcast changes the centroids
    results.put((rank, before.tolist(), layer.centroids.tolist()))
    dist.destroy_process_group()


def test_the_initial_centroids_are_broadcast_from_rank_0(tmp_path):
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(initial_centroids_worker, args=(str(tmp_path / "init"), results), nprocs=2, start_method="spawn")
    ranks = dict((r[0], r[1:]) for r in (results.get(), results.get()))
    (before0, after0), (before1, after1) = ranks[0], ranks[1]
    assert before0 != before1
    assert after0 == after1 == before0


# ---- models without Cluster-Former layers start no K-Means jobs ------------------------------------------------------


@pytest.mark.parametrize("swap_delay", [0, 1])
def test_a_model_without_cluster_layers_starts_no_kmeans_job(swap_delay, caplog):
    # sliding windows only, LSH or sparse under --task clusterformer_lm: the schedule is due, but nothing is banked
    refresher = CentroidRefresher(RefreshSettings(interval=2, swap_delay=swap_delay, backend="torch"))
    refresher.attach(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with caplog.at_level("INFO", logger="fairseq_clusterformer.refresh.refresher"):
        for update in range(1, 9):
            refresher.before_step(update)
            refresher.commit()
    assert refresher.refreshes_started == 0 and refresher.pending is None and refresher.num_refreshes == 0
    assert not [r for r in caplog.records if "K-Means" in r.getMessage()]
