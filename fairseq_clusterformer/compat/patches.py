"""What fairseq 0.12 lacks, put right by wrapping six of its functions; installed once when the package is imported
(so by ``--user-dir``), each wrapper marked so that a second install changes nothing.

1. ``data_utils.batch_by_size``: fairseq-fixed 0.12.3.1 (fairseq 0.12.2 ported to Python 3.11/3.12) drops the last
   batch when its size is not a multiple of ``--required-batch-size-multiple`` (default 8): training skips a few
   examples an epoch, and validation and ``fairseq-eval-lm`` silently score fewer tokens than the split holds. The
   official 0.12.2 keeps it; so does the wrapper (the batches are consecutive runs of the indices, so the dropped
   batch is exactly the indices after the last one returned).
2. ``checkpoint_utils.load_checkpoint_to_cpu``: torch.load checks no record's CRC-32 and names no file when one is
   truncated, so a flipped bit loads silently. Every load passes here (``fairseq-train`` resuming or
   ``--finetune-from-model``, ``fairseq-eval-lm``, the hub, this plug-in's scripts, ``--roberta-path``): the file is
   verified once, before torch reads it (``checkpoints.integrity``).
3. ``checkpoint_utils.save_checkpoint``: fairseq asks only rank 0 for the checkpoint's state, where a collective
   would wait forever, so the memory banks' shards are merged here, the last place every rank passes through
   (``task.before_checkpoint_save``). It also opens the save: see 4 and 5.
4. ``checkpoint_utils.torch_persistent_save``: fairseq writes ``<file>.tmp`` and renames it, but leaves the temp file
   behind when killed; the wrapper writes through a temp file that names its writer (``checkpoints.writes``). Within
   a save, a file other than checkpoint_last.pt is written without the memory banks
   (``task.checkpoint_for_copies``): only an exact resume needs them, and it reads checkpoint_last.pt.
5. ``PathManager.copy``: fairseq copies the file it wrote onto checkpoint_last.pt, checkpoint_best.pt, ... in place,
   so a kill during the copy leaves a truncated checkpoint_last.pt; the wrapper copies atomically, and within a save
   a copy onto checkpoint_last.pt writes the whole state, banks included. fairseq's own hook after a save
   (``task.post_save``, called by fairseq_cli.train once the copies exist) could only find the copies again and
   rewrite them; here every file is written right the first time.
6. ``EMA.__init__`` (``--store-ema``): fairseq's model EMA averages every buffer, and fails on an integer one; the
   buffers that are set, not learned (the K-Means state, the dictionary hashes) are copied instead (``compat.ema``,
   which also lets ``--store-ema`` resume a checkpoint saved without an EMA: 2. hands it the weights as its EMA).
And a distributed run's process group is destroyed at exit, which fairseq never does (``compat.process_group``), and
inside fairseq-eval-lm the loss and perplexity it prints are checked first (``compat.eval_lm_check``).
Remote paths (``PathManager`` URIs) and ``--write-checkpoints-asynchronously`` keep fairseq's own code.
"""

from __future__ import annotations

import functools
import logging
import os

import numpy as np
from fairseq import checkpoint_utils
from fairseq.data import data_utils
from fairseq.file_io import PathManager

from fairseq_clusterformer.checkpoints.integrity import verify_checkpoint
from fairseq_clusterformer.checkpoints.run_files import is_last_checkpoint
from fairseq_clusterformer.checkpoints.writes import atomic_copy, atomic_save
from fairseq_clusterformer.compat.ema import ema_from_weights_where_missing, install_ema_copies
from fairseq_clusterformer.compat.eval_lm_check import install_eval_lm_check
from fairseq_clusterformer.compat.process_group import end_process_group_at_exit

logger = logging.getLogger(__name__)


def drops_last_batch(batch_by_size=None) -> bool:
    """Whether ``batch_by_size`` loses the indices of a final batch smaller than the required multiple."""
    batch_by_size = batch_by_size or data_utils.batch_by_size
    batches = batch_by_size(
        np.arange(3, dtype=np.int64), num_tokens_fn=lambda i: 1, max_sentences=8, required_batch_size_multiple=8
    )
    return sum(len(batch) for batch in batches) < 3


def keep_last_batch(batch_by_size):
    @functools.wraps(batch_by_size)
    def batch_by_size_keeping_all(indices, *args, **kwargs):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = list(batch_by_size(indices, *args, **kwargs))
        covered = sum(len(batch) for batch in batches)
        if covered < len(indices):
            batches.append(indices[covered:])
        return batches

    batch_by_size_keeping_all.patched = True
    return batch_by_size_keeping_all


def verify_before_loading(load):
    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        local = PathManager.get_local_path(path)
        if os.path.isfile(local):  # a missing file gets fairseq's own error
            verify_checkpoint(local)
        state = load(path, *args, **kwargs)
        ema_from_weights_where_missing(state, path)
        return state

    load_checkpoint_to_cpu.patched = True
    return load_checkpoint_to_cpu


def _is_local(*paths: str) -> bool:
    return not any(PathManager.path_requires_pathmanager(path) for path in paths)


class _Save:
    """The save under way (one at a time, in the training loop): its task, and the whole state of the file it wrote
    without the banks, for a copy onto checkpoint_last.pt."""

    current: _Save | None = None

    def __init__(self, task) -> None:
        self.task = task
        self.written: str | None = None
        self.whole_state = None


def open_save(save_checkpoint):
    @functools.wraps(save_checkpoint)
    def save_checkpoint_gathering_banks(cfg, trainer, epoch_itr, val_loss):
        task = trainer.task
        if not cfg.no_save and hasattr(task, "before_checkpoint_save"):
            task.before_checkpoint_save()
        _Save.current = _Save(task)
        try:
            # the original sets ``save_checkpoint.best`` on whatever its module calls ``save_checkpoint`` (this
            # wrapper, from now on), which is where fairseq_cli.train reads it: the best-metric bookkeeping is kept
            return save_checkpoint(cfg, trainer, epoch_itr, val_loss)
        finally:
            _Save.current = None  # the state's CPU copy is freed with it

    save_checkpoint_gathering_banks.patched = True
    return save_checkpoint_gathering_banks


def write_atomically(torch_persistent_save):
    @functools.wraps(torch_persistent_save)
    def atomic_persistent_save(obj, filename, async_write: bool = False):
        if async_write or not _is_local(filename):
            return torch_persistent_save(obj, filename, async_write)
        save = _Save.current
        lighter = getattr(save.task, "checkpoint_for_copies", None) if save is not None else None
        if lighter is not None and not is_last_checkpoint(filename):
            light = lighter(obj)
            if light is not None:
                save.written, save.whole_state = filename, obj
                logger.info(f"memory banks kept out of {filename}: only checkpoint_last.pt keeps them")
                obj = light
        atomic_save(obj, filename)

    atomic_persistent_save.patched = True
    return atomic_persistent_save


def copy_atomically(copy):
    @functools.wraps(copy)
    def atomic_copy_onto(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if not _is_local(src_path, dst_path) or (os.path.exists(dst_path) and not overwrite):
            return copy(src_path, dst_path, overwrite)
        save = _Save.current
        if save is not None and save.written == src_path and is_last_checkpoint(dst_path):
            atomic_save(save.whole_state, dst_path)  # the banks' one home
        else:
            atomic_copy(src_path, dst_path)
        return True

    atomic_copy_onto.patched = True
    return atomic_copy_onto


def install_patches() -> None:
    """Install the six wrappers (idempotent)."""
    if not getattr(data_utils.batch_by_size, "patched", False) and drops_last_batch(data_utils.batch_by_size):
        data_utils.batch_by_size = keep_last_batch(data_utils.batch_by_size)
    for name, wrap in (
        ("load_checkpoint_to_cpu", verify_before_loading),
        ("save_checkpoint", open_save),
        ("torch_persistent_save", write_atomically),
    ):
        original = getattr(checkpoint_utils, name)
        if not getattr(original, "patched", False):
            setattr(checkpoint_utils, name, wrap(original))
    if not getattr(PathManager.copy, "patched", False):
        PathManager.copy = staticmethod(copy_atomically(PathManager.copy))
    install_ema_copies()
    install_eval_lm_check()
    end_process_group_at_exit()
