"""A micro-batch that runs out of GPU memory on one rank: fairseq's trainer skips it there and carries on with the
other ranks, so the bank exchange after it must still be entered on that rank (with no states), or all ranks hang."""

from unittest import mock

import pytest

from fairseq_clusterformer.refresh.task_hooks import CentroidRefreshHooks


class FailingTask:
    """fairseq's task train_step, failing as torch does when CUDA memory runs out (or with another error)."""

    error = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def train_step(self, *args, **kwargs):
        raise self.error


class Task(CentroidRefreshHooks, FailingTask):
    pass


def step(task):
    task.refresher = mock.Mock()
    with pytest.raises(RuntimeError):
        task.train_step(sample={}, model=None, criterion=None, optimizer=None, update_num=3)
    return task.refresher


def test_an_out_of_memory_micro_batch_still_enters_the_exchange_without_its_states():
    refresher = step(Task())
    refresher.before_step.assert_called_once_with(3)
    refresher.commit.assert_called_once_with(discard=True)


def test_other_errors_propagate_without_an_exchange():
    task = Task()
    task.error = RuntimeError("shape mismatch")  # fairseq re-raises these: the run stops on every rank
    refresher = step(task)
    refresher.commit.assert_not_called()
