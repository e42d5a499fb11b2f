"""The fairseq work-arounds the package installs on import."""

import numpy as np
from fairseq.data import data_utils

import fairseq_clusterformer  # noqa: F401  (installs the work-arounds)
from fairseq_clusterformer.compat.patches import drops_last_batch, keep_last_batch


def dropping(indices, num_tokens_fn, max_sentences=None, required_batch_size_multiple=1, **_):
    """fairseq-fixed 0.12.3.1's behaviour, standing in for it on any fairseq."""
    batches = [indices[i : i + max_sentences] for i in range(0, len(indices), max_sentences)]
    if required_batch_size_multiple > 1 and len(batches[-1]) % required_batch_size_multiple:
        batches = batches[:-1]
    return batches


def test_the_installed_fairseq_keeps_every_index_after_import():
    assert not drops_last_batch()
    for count in (1, 7, 60, 61):
        batches = data_utils.batch_by_size(
            np.arange(count, dtype=np.int64), lambda i: 10, max_sentences=4, required_batch_size_multiple=8
        )
        assert np.array_equal(np.concatenate(batches), np.arange(count))


def test_the_wrapper_restores_exactly_the_dropped_indices():
    assert drops_last_batch(dropping)
    fixed = keep_last_batch(dropping)
    assert not drops_last_batch(fixed)
    batches = fixed(np.arange(60, dtype=np.int64), lambda i: 1, max_sentences=8, required_batch_size_multiple=8)
    assert [len(b) for b in batches] == [8] * 7 + [4]
    assert np.array_equal(np.concatenate(batches), np.arange(60))
