"""The benchmarks' one timer, ``benchmarks.common.stopwatch``: wall and CPU seconds of a block, kept apart (a sleep is
wall time only, a spin is CPU time), set however the block ends, and on a CUDA device the waits for it before the
clocks start and before they stop; ``timed_repeats`` built on it."""

from __future__ import annotations

import time

import pytest
import torch

from benchmarks.common import stopwatch, timed_repeats


def test_a_sleep_is_wall_time_and_not_cpu_time():
    with stopwatch() as took:
        time.sleep(0.2)
    assert took.wall >= 0.2
    assert took.cpu < 0.1  # asleep, the process uses no CPU


def test_a_spin_is_cpu_time():
    with stopwatch() as took:
        start = time.process_time()
        while time.process_time() - start < 0.1:
            pass
    assert took.cpu >= 0.1
    assert took.wall >= 0.1  # CPU time of one thread never runs ahead of the wall clock


def test_the_seconds_are_set_when_the_block_raises():
    with pytest.raises(ValueError), stopwatch() as took:
        time.sleep(0.05)
        raise ValueError("the timed work failed")
    assert took.wall >= 0.05


@pytest.mark.parametrize("device", ["cuda", torch.device("cuda", 0)])
def test_a_cuda_device_is_waited_for_before_the_clocks_start_and_before_they_stop(monkeypatch, device):
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync", str(device))))
    monkeypatch.setattr(time, "perf_counter", lambda: events.append(("clock",)) or 0.0)
    with stopwatch(device):
        events.append(("block",))
    expected = torch.device(device)
    assert events == [("sync", str(expected)), ("clock",), ("block",), ("sync", str(expected)), ("clock",)]


@pytest.mark.parametrize("device", [None, "cpu"])
def test_no_device_or_a_cpu_waits_for_nothing(monkeypatch, device):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    with stopwatch(device) as took:
        pass
    assert calls == [] and took.wall >= 0 and took.cpu >= 0


def test_timed_repeats_times_each_call_after_the_warm_up():
    calls = []
    wall, cpu = timed_repeats(lambda: calls.append(time.sleep(0.01)), warmup=2, repeats=3)
    assert len(calls) == 5 and len(wall) == len(cpu) == 3
    assert all(w >= 0.01 for w in wall)
