"""benchmarks/qa_device/schedule.py's decisions, on a clock the test sets: stand-in runs are `sleep` processes whose
training logs the test writes (`num_updates=N`, as fairseq's do)."""

from pathlib import Path

import pytest

from benchmarks.qa_device.schedule import Controller, RunState, launch

T0 = 1000.0


class Runs:
    """Stand-in stages: training is `sleep 600` with a log the test writes; no other stage."""

    def __init__(self, root: Path):
        self.root, self.messages = root, []

    def start_stage(self, state, name):
        return launch(name, ["sleep", "600"], self.log_of(state)) if name == "train" else None

    def finish_stage(self, state, stage):
        return "predict" if stage.name == "train" else "done"

    def log_of(self, state) -> Path:
        return self.root / f"{state.name}.log"

    def progress(self, state, updates: int) -> None:
        with open(self.log_of(state), "a") as f:
            f.write(f"| train_inner | num_updates={updates}, lr=0.0001\n")


def controller(tmp_path, count, initial, stop_after=100.0, updates=100):
    runs = Runs(tmp_path)
    states = [RunState(f"run{i}", i, updates, scoring_s=0.0, reach=False) for i in range(count)]
    control = Controller(states, T0 + stop_after, initial, runs.start_stage, runs.finish_stage, runs.messages.append,
                         cooldown_s=30.0, min_span_s=20.0, startup_s=5.0)  # fmt: skip
    return control, states, runs


@pytest.fixture
def cleanup():
    started = []
    yield started
    for control in started:
        control.step(control.stop_at)  # stops every stand-in process


def test_the_lowest_priority_run_is_given_up_when_a_run_is_projected_late(tmp_path, cleanup):
    control, (first, second), runs = controller(tmp_path, 2, initial=2)
    cleanup.append(control)
    control.step(T0)
    assert [s.status for s in (first, second)] == ["train", "train"]
    process = second.stage.proc
    for t, updates in ((T0 + 10, 10), (T0 + 30, 20)):
        for state in (first, second):
            runs.progress(state, updates)
        control.step(t)
    # 0.5 updates/s: 80 left take 160 s, past the stop at T0 + 100: the second run goes
    assert second.status == "given_up" and first.status == "train"
    assert "2 run(s) projected past the stop time" in second.note
    assert second.stage is None and process.poll() is not None  # its process group was ended
    # with the GPU to itself the first run speeds up: counted from the give-up, it ends in time and stays
    runs.progress(first, 60)
    control.step(T0 + 45)
    runs.progress(first, 70)
    control.step(T0 + 65)
    assert first.status == "train"


def test_a_run_is_given_up_only_after_the_cooldown_and_on_a_measured_rate(tmp_path, cleanup):
    control, (first,), runs = controller(tmp_path, 1, initial=1)
    cleanup.append(control)
    control.step(T0)
    runs.progress(first, 1)
    control.step(T0 + 1)
    runs.progress(first, 2)
    control.step(T0 + 11)  # 0.1 updates/s, far too slow, but measured over 10 s only
    assert first.status == "train"
    runs.progress(first, 4)
    control.step(T0 + 31)
    assert first.status == "given_up"  # alone and late: its result would be lost anyway


def test_waiting_runs_start_only_when_they_are_projected_to_end_in_time(tmp_path, cleanup):
    control, (first, second, third), runs = controller(tmp_path, 3, initial=1, stop_after=150.0)
    cleanup.append(control)
    control.step(T0)
    assert [s.status for s in (first, second, third)] == ["train", "waiting", "waiting"]
    runs.progress(first, 10)
    control.step(T0 + 5)
    runs.progress(first, 60)
    # 2 updates/s; sharing, each would get 1: the second ends at T0 + 30 + 5 (start-up) + 100 s, the first at + 40 s
    control.step(T0 + 30)
    assert second.status == "train" and third.status == "waiting"
    runs.progress(first, 70)
    runs.progress(second, 5)
    control.step(T0 + 40)
    runs.progress(first, 80)
    runs.progress(second, 15)
    control.step(T0 + 61)  # rates 0.65 / 0.48: a third run would get 2/3 of their mean, 270 s for 100 updates
    assert third.status == "waiting"


def test_a_run_that_has_not_advanced_in_its_window_starts_nothing_and_divides_nothing(tmp_path, cleanup):
    """On a loaded machine a measured run may log no update in its window (rate 0): the controller neither projects
    with it (a division by zero once ended the device call) nor starts more runs on it."""
    control, (first, second), runs = controller(tmp_path, 2, initial=1, stop_after=400.0)
    cleanup.append(control)
    control.step(T0)
    runs.progress(first, 10)
    control.step(T0 + 5)
    control.step(T0 + 60)  # measured over 55 s, no update since: rate 0
    assert first.status == "train" and second.status == "waiting"


def test_at_the_stop_time_every_stage_is_stopped_and_waiting_runs_are_not_started(tmp_path):
    control, (first, second), runs = controller(tmp_path, 2, initial=1)
    control.step(T0)
    process = first.stage.proc
    assert control.step(T0 + 100) is False
    assert process.poll() is not None  # the sleep was ended
    assert first.status == "stopped" and "stopped by the budget in its train stage" in first.note
    assert second.status == "not_started"
