"""The K-Means hook every Cluster-Former task shares: its flags and the fairseq task methods that drive it.

A task mixes ``CentroidRefreshHooks`` in before its fairseq base class (``class T(CentroidRefreshHooks,
LanguageModelingTask)``) and adds ``MemoryBankConfig`` to its config dataclass. No
``from __future__ import annotations`` here: fairseq reads the config field types at run time.
"""

import functools
import logging
import time
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum
from fairseq.utils import safe_getattr

from fairseq_clusterformer.modules.centroid_refresh import CentroidRefresher, RefreshSettings
from fairseq_clusterformer.modules.rank_exchange import world
from fairseq_clusterformer.ops.kmeans import KMEANS_BACKENDS
from fairseq_clusterformer.tasks.checkpoint_files import (
    check_checkpoint_file,
    check_model_fits,
    checkpoint_files_to_load,
    keep_banks_in_last_only,
    save_dir_of,
)
from fairseq_clusterformer.tasks.checkpoint_writes import install_atomic_checkpoint_writes, remove_stale_temp_files

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
    carries only a summary, which inference uses to say where the centroids came from.
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
        """Before training starts: the checkpoint it will resume from is intact and fits the model these flags
        build, the save dir holds no debris of killed saves, and this run's saves and copies are atomic."""
        # fairseq's legacy tasks (language_modeling) keep their config in ``args``, the others in ``cfg``
        task_cfg = getattr(self, "cfg", None) or getattr(self, "args", None)
        if task_cfg is None:
            return
        flags = " ".join(
            f"{flag} {value}"
            for flag, value in (
                ("--long-range-layers", safe_getattr(model_cfg, "long_range_layers", None)),
                ("--long-range-layer", safe_getattr(model_cfg, "long_range_layer", None)),
            )
            if value is not None
        )
        for flag, path in checkpoint_files_to_load(task_cfg):
            check_checkpoint_file(path, flag)
            check_model_fits(path, flag, model, flags or "the flags")
        install_bank_gather_before_saves()
        save_dir = save_dir_of(task_cfg)
        if save_dir is not None and world()[0] == 0:  # rank 0 writes the checkpoints
            install_atomic_checkpoint_writes()
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
        summary = state.pop(CHECKPOINT_KEY, None)
        super().load_state_dict(state)
        describe_centroids(summary)

    def get_checkpoint_dict(self):
        base = getattr(super(), "get_checkpoint_dict", dict)()
        self._save_started = time.time()
        return {**base, type(self).__name__: {CHECKPOINT_KEY: self.refresher.state_dict()}}

    def post_save(self, cp_path, num_updates):
        """Only an exact resume needs the memory banks, and it resumes from checkpoint_last.pt: the best, epoch and
        update checkpoints of this save lose them (fine-tuning or resuming from one refills the banks)."""
        base = getattr(super(), "post_save", None)
        if base is not None:
            base(cp_path, num_updates)
        since = getattr(self, "_save_started", None)
        if since is not None:
            rewritten = keep_banks_in_last_only(cp_path, since, type(self).__name__, CHECKPOINT_KEY)
            if rewritten:
                logger.info(f"memory banks kept in checkpoint_last only, dropped from {', '.join(rewritten)}")

    def set_checkpoint_dict(self, state):
        base = getattr(super(), "set_checkpoint_dict", None)
        if base is not None:
            base(state)
        if CHECKPOINT_KEY in state:
            self.refresher.load_state_dict(state[CHECKPOINT_KEY])


def install_bank_gather_before_saves() -> None:
    """Merge the ranks' bank shards into rank 0's before every checkpoint save (once per process, idempotent).

    fairseq 0.12 asks only rank 0 for the checkpoint's state (``Trainer.save_checkpoint``), where a collective would
    wait forever for the other ranks; ``checkpoint_utils.save_checkpoint`` is the last place every rank passes
    through (fairseq_cli.train calls it on all ranks with the same arguments), so the merge goes in front of it. The
    original sets ``save_checkpoint.best`` on whatever its module calls ``save_checkpoint`` (this wrapper, from now
    on), which is where fairseq_cli.train reads it: the best-metric bookkeeping is unchanged.
    """
    from fairseq import checkpoint_utils

    original = checkpoint_utils.save_checkpoint
    if getattr(original, "gathers_banks", False):
        return

    @functools.wraps(original)
    def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
        refresher = getattr(trainer.task, "refresher", None)
        if refresher is not None and not cfg.no_save:
            refresher.banks.gather()
        return original(cfg, trainer, epoch_itr, val_loss)

    save_checkpoint.gathers_banks = True
    checkpoint_utils.save_checkpoint = save_checkpoint


def describe_centroids(summary) -> None:
    """Log where a loaded checkpoint's centroids come from (a checkpoint from before any refresh still works)."""
    if summary is None:
        return
    never = [index for index, count in enumerate(summary["layer_refreshes"]) if count == 0]
    if never:
        logger.warning(
            f"this checkpoint was written before the first K-Means refresh of long-range layer(s) {never}: they use "
            "their random, greedily ordered initial centroids"
        )
    else:
        logger.info(f"the checkpoint's centroids come from {summary['num_refreshes']} K-Means refreshes")
