"""Work-arounds for the fairseq releases this plug-in supports (imported by the package, so by --user-dir).

fairseq-fixed 0.12.3.1 (fairseq 0.12.2 ported to Python 3.11/3.12) added one behaviour change to
``fairseq.data.data_utils.batch_by_size``: when the last batch's size is not a multiple of
``--required-batch-size-multiple`` (default 8) it is dropped. Training then skips a few examples per epoch, and
validation and ``fairseq-eval-lm`` silently score fewer tokens than the split holds (up to 7 blocks of
``--tokens-per-sample`` tokens), which changes the reported perplexity. The official 0.12.2 keeps that batch. We
restore the official behaviour: the batches are consecutive runs of the given indices, so the dropped batch is
exactly the indices after the last one returned.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
from fairseq.data import data_utils

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

    batch_by_size_keeping_all.keeps_last_batch = True
    return batch_by_size_keeping_all


def restore_official_batching() -> bool:
    """Patch fairseq-fixed's batch_by_size back to fairseq 0.12.2's semantics; True when a patch was needed."""
    current = data_utils.batch_by_size
    if getattr(current, "keeps_last_batch", False) or not drops_last_batch(current):
        return False
    data_utils.batch_by_size = keep_last_batch(current)
    logger.info("fairseq_clusterformer: keeping the last batch that this fairseq's batch_by_size would drop")
    return True
