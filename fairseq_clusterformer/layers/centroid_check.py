"""A checkpoint whose long-range layers have no K-Means centroids, named as such when a model loads it.

A Cluster-Former layer clusters with the ``centroids`` buffer that K-Means fitted during training, and a checkpoint
carries it. One without them - trained with another --long-range-layer (LSH, sparse and sliding-window layers have
no centroids) or other --long-range-layers, written by a version that did not save them, or not a Cluster-Former
checkpoint at all - otherwise stops in torch's strict load with a list of "Missing key(s)" that says neither which
layers lack what nor why it matters. The check is a load-state-dict post hook on the whole model, so that it sees
every missing key of every layer at once, whatever loads the weights (fairseq-eval-lm, a resume, the hub, the
plug-in's scripts).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

from torch import nn

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer

CENTROIDS = "centroids"
LAYER_NUMBER = re.compile(r"(?:^|\.)layers\.(\d+)$")


class MissingCentroidsError(ValueError):
    """The checkpoint lacks the centroids of one or more of the model's Cluster-Former layers."""


def layer_number(name: str) -> str:
    """'decoder.layers.10' -> '11' (1-based, as --long-range-layers counts); the module name otherwise."""
    match = LAYER_NUMBER.search(name)
    return str(int(match.group(1)) + 1) if match else name


def check_centroids_loaded(model: nn.Module, incompatible_keys) -> None:
    """``register_load_state_dict_post_hook`` hook: raise MissingCentroidsError when a Cluster-Former layer's
    centroids were not in the loaded state dict. Also on a non-strict load: the layer would go on clustering with
    its random initial centroids, a silently wrong model."""
    missing = set(incompatible_keys.missing_keys)
    lacking = [
        name
        for name, module in model.named_modules()
        if isinstance(module, ClusterFormerLayer) and f"{name}.{CENTROIDS}" in missing
    ]
    if not lacking:
        return
    numbers = ", ".join(layer_number(name) for name in lacking)
    keys = ", ".join(f"{name}.{CENTROIDS}" for name in lacking)
    # centroids the model has no Cluster-Former layer for: the layers the checkpoint was trained with
    suffix = f".{CENTROIDS}"
    elsewhere = [layer_number(k[: -len(suffix)]) for k in incompatible_keys.unexpected_keys if k.endswith(suffix)]
    if elsewhere:
        trained = ", ".join(elsewhere)
        why = f"it has centroids for layer(s) {trained} instead: it was trained with other --long-range-layers"
    else:
        why = (
            "it was trained with another --long-range-layer (lsh, sparse and none have no centroids) or other "
            "--long-range-layers, written by an older version, or is not a Cluster-Former checkpoint"
        )
    raise MissingCentroidsError(
        f"the checkpoint has no K-Means centroids for the Cluster-Former layer(s) {numbers} of this model ({keys}), "
        f"which cluster the tokens with them: {why}. Evaluate it with the flags it was trained with (the "
        "checkpoint's own, without --model-overrides of these)"
    )


@contextlib.contextmanager
def naming_checkpoint(path: str | os.PathLike, flag: str = "--path") -> Iterator[None]:
    """Around a load of the checkpoint ``path``: its MissingCentroidsError names the file (the hook cannot)."""
    try:
        yield
    except MissingCentroidsError as error:
        raise MissingCentroidsError(f"{flag} {path}: {error}") from None
