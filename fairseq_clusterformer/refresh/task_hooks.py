"""The K-Means hook every Cluster-Former task shares: its flags and the fairseq task methods that drive it.

A task mixes ``CentroidRefreshHooks`` in before its fairseq base class (``class T(CentroidRefreshHooks,
LanguageModelingTask)``) and adds ``MemoryBankConfig`` to its config dataclass. No
``from __future__ import annotations`` here: fairseq reads the config field types at run time.
"""

import logging
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum

from fairseq_clusterformer.checkpoints.model_fit import check_finetune_dictionary, check_resume_fits
from fairseq_clusterformer.checkpoints.run_files import checkpoint_files_to_load, finetune_file, save_dir_of
from fairseq_clusterformer.checkpoints.writes import remove_stale_temp_files
from fairseq_clusterformer.ops.kmeans import KMEANS_BACKENDS
from fairseq_clusterformer.refresh.rank_exchange import world
from fairseq_clusterformer.refresh.refresher import CentroidRefresher, RefreshSettings

logger = logging.getLogger(__name__)

CHECKPOINT_KEY = "centroid_refresh"


@dataclass
class MemoryBankConfig:
    """The K-Means hook's flags; shared by every Cluster-Former task."""

    memory_size: int = field(
        default=100_000,
        metadata={"help": "states kept per long-range layer for K-Means (all ranks together, on rank 0)"},
    )
    cluster_update_interval: int = field(
        default=0,
        metadata={"help": "updates between centroid refreshes; 0 = at the start of every epoch after the first"},
    )
    kmeans_iters: int = field(default=20, metadata={"help": "K-Means iterations per refresh"})
    memory_sample_per_batch: int = field(
        default=0, metadata={"help": "random states per batch and layer written to the bank; 0 = all"}
    )
    kmeans_backend: ChoiceEnum(KMEANS_BACKENDS) = field(
        default="auto",
        metadata={
            "help": "auto (torch on a GPU, faiss on a CPU when installed: the faster of the two there), torch (Lloyd "
            "iterations that skip points whose cluster cannot change; on the model's device) or faiss (a GPU index "
            "when the model is on a GPU and faiss-gpu is installed)"
        },
    )
    kmeans_swap_delay: int = field(
        default=4,
        metadata={
            "help": "updates between a bank snapshot and installing the centroids K-Means computed from it on a "
            "background thread (at the latest when the next refresh is due); 0 = synchronous, in the training loop"
        },
    )


def refresh_settings(cfg) -> RefreshSettings:
    """The hook's flags, checked by ``RefreshSettings``."""
    return RefreshSettings(
        memory_size=cfg.memory_size,
        sample_per_batch=cfg.memory_sample_per_batch,
        interval=cfg.cluster_update_interval,
        iters=cfg.kmeans_iters,
        backend=str(cfg.kmeans_backend),
        seed=cfg.seed,
        swap_delay=cfg.kmeans_swap_delay,
    )


class CentroidRefreshHooks:
    """fairseq task methods that fill the memory banks in training, refresh the centroids, and checkpoint both.

    The subclass must call ``self.init_centroid_refresh(cfg)`` in its ``__init__``.

    Checkpoints: fairseq 0.12 saves ``task.state_dict()`` as the checkpoint's ``task_state`` but hands it back only
    when a model is loaded for inference (``load_model_ensemble_and_task``), never on a training resume. The banks
    and the schedule therefore travel in ``get_checkpoint_dict`` (saved in ``extra_state[<task class>]``) and come
    back through ``set_checkpoint_dict`` on every rank on ``--restore-file`` and automatic resume; ``task_state``
    carries only a summary (refresh counts) for whoever reads the file; the layers' own buffers say, as they load,
    whether their centroids were ever refreshed.
    """

    refresher: CentroidRefresher

    def init_centroid_refresh(self, cfg) -> None:
        self.refresher = CentroidRefresher(refresh_settings(cfg))

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        self.refresher.attach(model)
        if not from_checkpoint:  # a training run (a model rebuilt from a checkpoint is for inference)
            self.prepare_checkpoints(cfg, model)
        return model

    def prepare_checkpoints(self, model_cfg, model) -> None:
        """Before training starts: the checkpoint it will resume from fits the model these flags build (its
        integrity is checked when fairseq loads it, ``compat.patches``), and the save dir holds no debris of killed
        saves."""
        # fairseq's legacy tasks (language_modeling) keep their config in ``args``, the others in ``cfg``
        task_cfg = getattr(self, "cfg", None) or getattr(self, "args", None)
        if task_cfg is None:
            return
        for flag, path in checkpoint_files_to_load(task_cfg):
            check_resume_fits(path, flag, model, model_cfg)
        finetune = finetune_file(task_cfg)
        if finetune is not None:
            check_finetune_dictionary(finetune, model)
        save_dir = save_dir_of(task_cfg)
        if save_dir is not None and world()[0] == 0:  # rank 0 writes the checkpoints
            remove_stale_temp_files(save_dir)

    def begin_epoch(self, epoch, model):
        super().begin_epoch(epoch, model)
        self.refresher.begin_epoch(epoch)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        # the first micro-batch of an update is the same moment on every rank: refreshes start and install there
        self.refresher.before_step(update_num)
        try:
            result = super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        except RuntimeError as error:
            if "out of memory" in str(error):
                # fairseq's trainer skips this micro-batch on this rank only and goes on; the other ranks still enter
                # the exchange below, so this rank must too (with no states: the failed pass's are dropped), or
                # every rank waits for it forever
                self.refresher.commit(discard=True)
            raise
        # fairseq gives every rank the same number of micro-batches (dummy ones with ignore_grad), so this exchange
        # of banked states is reached by all ranks together
        self.refresher.commit(discard=ignore_grad)
        self.refresher.log_stats()
        return result

    def state_dict(self):
        return {**super().state_dict(), CHECKPOINT_KEY: self.refresher.summary()}

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        # the summary is for readers of the file; where the centroids come from, the layers say as they load
        state.pop(CHECKPOINT_KEY, None)
        super().load_state_dict(state)

    def get_checkpoint_dict(self):
        base = getattr(super(), "get_checkpoint_dict", dict)()
        return {**base, type(self).__name__: {CHECKPOINT_KEY: self.refresher.state_dict()}}

    def before_checkpoint_save(self) -> None:
        """On every rank, before each save (``compat.patches``): the ranks' bank shards meet in rank 0's bank."""
        self.refresher.banks.gather()

    def checkpoint_for_copies(self, state: dict) -> dict | None:
        """``state`` without the memory banks, for every checkpoint file but checkpoint_last.pt: only an exact resume
        needs them (0.8 GB at WikiText-103 size), and it reads checkpoint_last.pt; fine-tuning or resuming from
        another file refills them. None when the state has none. ``state`` itself is left as it is."""
        entry = state.get("extra_state", {}).get(type(self).__name__, {})
        refresh = entry.get(CHECKPOINT_KEY)
        if refresh is None or refresh.get("banks") is None:
            return None
        extra = {**state["extra_state"], type(self).__name__: {**entry, CHECKPOINT_KEY: {**refresh, "banks": None}}}
        return {**state, "extra_state": extra}

    def set_checkpoint_dict(self, state):
        base = getattr(super(), "set_checkpoint_dict", None)
        if base is not None:
            base(state)
        if CHECKPOINT_KEY in state:
            self.refresher.load_state_dict(state[CHECKPOINT_KEY])
