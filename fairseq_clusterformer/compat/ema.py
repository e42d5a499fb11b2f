"""fairseq's model EMA (``--store-ema``) on a model whose buffers are set rather than learned.

fairseq 0.12's ``EMA`` moves every entry of the model's state dict towards the live model's, ``decay * ema +
(1 - decay) * live``, buffers included, and only the keys it is given as ``skip_keys`` are copied instead. The trainer
gives none, so the first EMA step fails on an integer buffer (the dictionary hashes, a Cluster-Former layer's refresh
count: "result type Float can't be cast to the desired output type Int"). An average would also be wrong for the
K-Means state: centroids halfway between those before and after a refresh are no longer unit vectors nor greedily
ordered, and the EMA weights would be scored with centroids no layer was trained with.

``EMA.__init__`` is wrapped so that these entries join its ``skip_keys``: every entry that is not a float tensor,
and the buffers a module names in its ``ema_copies`` (a Cluster-Former layer's centroids, shares and refresh count).
The EMA model then always holds the live model's K-Means state and dictionary, with averaged weights.

``EMA.restore`` is wrapped too: an EMA step leaves every key named ``version`` out of the state it loads into its
model, and fairseq's decoder takes a missing ``decoder.version`` for its oldest format and drops its final layer
norm, so the EMA weights scored as nonsense (a loss of 28 bits where the model's was 9). The EMA model keeps its own
version entries.

``Trainer.load_checkpoint`` is wrapped too: resuming with ``--store-ema`` from a checkpoint saved without an EMA, the
trainer means to start the EMA from the checkpoint's weights, but reads ``state["model"]`` after it has deleted it
(``KeyError: 'model'``). While a ``--store-ema`` trainer loads, the loaded state gets its model weights as its EMA
(``ema_from_weights_where_missing``, called by ``compat.patches``' load wrapper), with a warning naming the flag.
"""

from __future__ import annotations

import functools
import logging

import torch
from fairseq.models.ema import EMA
from fairseq.trainer import Trainer
from torch import nn

logger = logging.getLogger(__name__)

# set while a --store-ema trainer loads its checkpoint (the training loop loads one file at a time)
_loading_for_ema = False


def copied_keys(model: nn.Module) -> set[str]:
    """The state-dict keys the EMA must copy from the live model, not average."""
    keys = {k for k, v in model.state_dict().items() if torch.is_tensor(v) and not torch.is_floating_point(v)}
    for name, module in model.named_modules():
        for buffer in getattr(module, "ema_copies", ()):
            keys.add(f"{name}.{buffer}" if name else buffer)
    return keys


def copy_set_buffers(init):
    @functools.wraps(init)
    def ema_init_copying_set_buffers(self, model, config, device=None, skip_keys=None):
        init(self, model, config, device=device, skip_keys=set(skip_keys or ()) | copied_keys(model))

    ema_init_copying_set_buffers.patched = True
    return ema_init_copying_set_buffers


def keep_versions(restore):
    @functools.wraps(restore)
    def restore_keeping_versions(self, state_dict, build_fp32_params=False):
        own = self.model.state_dict()
        versions = {key: value for key, value in own.items() if "version" in key and key not in state_dict}
        return restore(self, {**state_dict, **versions}, build_fp32_params=build_fp32_params)

    restore_keeping_versions.patched = True
    return restore_keeping_versions


def ema_from_weights_where_missing(state, path: str) -> None:
    """Inside a ``--store-ema`` trainer's load: a checkpoint without an EMA gets its model weights as the EMA (a
    shallow copy: the trainer deletes ``state["model"]`` once loaded)."""
    extra = state.get("extra_state") if _loading_for_ema and isinstance(state, dict) else None
    if isinstance(extra, dict) and "ema" not in extra and "model" in state:
        logger.warning(
            f"--store-ema: {path} was saved without an EMA (trained without --store-ema); the EMA starts from its "
            "model weights"
        )
        extra["ema"] = dict(state["model"])


def mark_ema_loads(load_checkpoint):
    @functools.wraps(load_checkpoint)
    def load_checkpoint_for_ema(self, *args, **kwargs):
        global _loading_for_ema
        _loading_for_ema = bool(self.cfg.ema.store_ema)
        try:
            return load_checkpoint(self, *args, **kwargs)
        finally:
            _loading_for_ema = False

    load_checkpoint_for_ema.patched = True
    return load_checkpoint_for_ema


def install_ema_copies() -> None:
    """Wrap ``EMA.__init__``, ``EMA.restore`` and ``Trainer.load_checkpoint`` (idempotent)."""
    if not getattr(Trainer.load_checkpoint, "patched", False):
        Trainer.load_checkpoint = mark_ema_loads(Trainer.load_checkpoint)
    if not getattr(EMA.__init__, "patched", False):
        EMA.__init__ = copy_set_buffers(EMA.__init__)
    if not getattr(EMA.restore, "patched", False):
        EMA.restore = keep_versions(EMA.restore)
