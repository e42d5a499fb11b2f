"""What a checkpoint written by an earlier version of this plug-in lacks or holds besides today's layout, and how it
loads all the same: the rules only old files need, in one place, so that a reader finds them all (and a release that
stops reading such files drops them together). ``tests/test_old_checkpoints.py`` loads checkpoints of an earlier
version (``tests/data/old_checkpoints``) through them.

Here, called by the models and tasks on load:
- ``drop_task_dictionary_hash``: the language-model task's state once carried a hash of the dictionary;
- ``grow_answer_types``: a Natural Questions answer-type head from before the yes / no classes.

Where the rooms keep them (a layer imports nothing above ``ops``; a record is read where it is defined):
- ``layers/cluster.py``, ``ClusterFormerLayer._load_from_state_dict``: centroids saved without their shares (before
  the strict mode cut groups by cluster shares: equal shares) or without the refresh count (the model's own);
- ``refresh/kmeans_job.py``, ``LayerResult.from_state_dict``: a pending refresh without its shares or its centroid
  shift (``nearest_cosine``, ``agreement``);
- ``checkpoints/dictionary.py``, ``check_dictionary``: weights saved before the training dictionary was recorded in
  them (a warning, the model's own record);
- ``qa/model.py``, ``qa_long_range_plan``: a saved config from before ``--long-range-mode`` (``replace``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

# the key of the dictionary hash in an old language-model task state
TASK_DICTIONARY_KEY = "dictionary"
# the bias of a class added to an older checkpoint's head: far below any logit a trained head gives, so the class
# never wins, and still finite in fp16
ADDED_CLASS_BIAS = -1e4


def drop_task_dictionary_hash(task_state: dict) -> dict:
    """The task state without the old dictionary hash, dropped unread: the dictionary is recorded in the model's
    weights now (``checkpoints.dictionary``, checked on every load)."""
    return {name: value for name, value in task_state.items() if name != TASK_DICTIONARY_KEY}


def grow_answer_types(state_dict: dict[str, Tensor], prefix: str, classes: Sequence[str]) -> int:
    """Grow the answer-type head of a checkpoint trained with fewer classes (none / long / short, before yes / no
    were added after them) to ``classes``; returns how many classes were added.

    The added classes get zero weights and ADDED_CLASS_BIAS: the checkpoint answers exactly as it was trained to
    (its own classes keep their logits, the new ones never win) instead of failing to load.
    """
    head = prefix + "qa_heads.answer_type.out_proj."
    weight_key, bias_key = head + "weight", head + "bias"
    if weight_key not in state_dict or bias_key not in state_dict:
        return 0
    weight, bias = state_dict[weight_key], state_dict[bias_key]
    missing = len(classes) - weight.shape[0]
    if missing <= 0:
        return 0  # the current head, or a larger one, which load_state_dict refuses by its shape
    state_dict[weight_key] = torch.cat([weight, weight.new_zeros(missing, weight.shape[1])])
    state_dict[bias_key] = torch.cat([bias, bias.new_full((missing,), ADDED_CLASS_BIAS)])
    kept = ", ".join(classes[: weight.shape[0]])
    logger.warning(
        f"the checkpoint's answer-type head has {weight.shape[0]} classes ({kept}): the classes "
        f"{', '.join(classes[weight.shape[0] :])} are added with bias {ADDED_CLASS_BIAS:g}, so it never predicts "
        "them; train from the pretrained model to learn them (resuming this training needs --reset-optimizer)"
    )
    return missing
