"""Side-by-side runs on one GPU under a time budget: which run starts when, which one is given up, and why.

Each run goes through three stages, one subprocess each (its own process group, so that a stop ends fairseq-train
and everything under it): train, predict, and for the Cluster-Former runs reach. Every few seconds the controller
reads each training log's latest ``num_updates`` and from the last ``RATE_WINDOW_S`` seconds of them the run's rate,
then
- projects every training run's end (remaining updates / rate, plus its scoring): when one would end past the stop
  time, it gives up the lowest-priority training run (that one's result would be lost anyway, or it frees the GPU
  for the runs ahead of it), at most one per ``cooldown_s``, so that the others' rates can show the freed share;
- starts waiting runs, up to ``initial`` at once, while no rate is known yet; afterwards one only if, with every
  run slowed by n / (n + 1) (as if the GPU were the bottleneck), it and the running ones still end before the stop
  time (its own rate taken as the others' mean, its start-up as theirs);
- at the stop time stops whatever still runs. A stopped or given-up run leaves no result: the next call runs it again.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

UPDATES = re.compile(r"num_updates[= ](\d+)")
RATE_WINDOW_S = 45.0


@dataclass
class Stage:
    name: str  # train | predict | reach
    proc: subprocess.Popen
    log: Path
    started: float


@dataclass
class RunState:
    name: str
    priority: int  # 0 = first
    updates: int  # to train
    scoring_s: float  # expected predict seconds after training
    reach: bool
    status: str = "waiting"  # waiting | train | predict | reach | done | given_up | stopped | not_started | failed
    stage: Stage | None = None
    samples: list[tuple[float, int]] = field(default_factory=list)  # (time, num_updates) when it changed
    times: dict[str, float] = field(default_factory=dict)
    note: str = ""
    since: float = 0.0  # rates count from here (set at every give-up)

    def done_updates(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def rate(self) -> float | None:
        """Updates per second over the last RATE_WINDOW_S seconds, and only since ``since`` (the last give-up, which
        freed a share of the GPU) where two samples lie there; None before two samples."""
        if len(self.samples) < 2:
            return None
        start = self.samples[-1][0] - RATE_WINDOW_S
        recent = [s for s in self.samples if s[0] >= max(start, self.since)]
        recent = recent if len(recent) >= 2 else [s for s in self.samples if s[0] >= start]
        first, last = recent[0] if len(recent) >= 2 else self.samples[0], self.samples[-1]
        return (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else None

    def projected_end(self, now: float, slowdown: float = 1.0) -> float | None:
        rate = self.rate()
        if rate is None or rate <= 0:
            return None
        return now + (self.updates - self.done_updates()) / (rate * slowdown) + self.scoring_s


def launch(name: str, command: list[str], log: Path, env: dict[str, str] | None = None) -> Stage:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True)  # fmt: skip
    return Stage(name, proc, log, time.time())


def stop(stage: Stage) -> None:
    """End the stage's whole process group (train.sh, fairseq-train and its workers)."""
    if stage.proc.poll() is None:
        os.killpg(stage.proc.pid, signal.SIGTERM)
        try:
            stage.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(stage.proc.pid, signal.SIGKILL)
            stage.proc.wait()


def latest_updates(log: Path) -> int | None:
    found = UPDATES.findall(log.read_text(encoding="utf-8", errors="replace")) if log.is_file() else []
    return int(found[-1]) if found else None


@dataclass
class Controller:
    states: list[RunState]
    stop_at: float  # epoch seconds: every stage is stopped here
    initial: int  # runs started before any rate is known
    start_stage: Callable[[RunState, str], Stage | None]  # (run, stage name) -> the launched stage, None = skip it
    finish_stage: Callable[[RunState, Stage], str]  # -> the next stage name, "done" or "failed"
    log: Callable[[str], None]
    cooldown_s: float = 30.0
    min_span_s: float = 20.0  # a rate is trusted once its updates span this long
    startup_s: float = 60.0  # launch to first logged update, until measured
    last_give_up: float = 0.0
    finished_rates: list[float] = field(default_factory=list)  # rates of runs that finished training

    def active(self, *statuses: str) -> list[RunState]:
        return [s for s in self.states if s.status in statuses]

    def step(self, now: float) -> bool:
        """One look at every run; False once nothing is left to do."""
        for state in self.active("train", "predict", "reach"):
            self.poll(state, now)
        if now >= self.stop_at:
            for state in self.active("train", "predict", "reach"):
                stop(state.stage)
                state.note = f"stopped by the budget in its {state.status} stage ({state.done_updates()} updates)"
                # a run stopped while qa-reach measured it is scored already (its folder was written)
                state.status = "done" if state.status == "reach" else "stopped"
                self.log(f"{state.name}: {state.note}")
            for state in self.active("waiting"):
                state.status, state.note = "not_started", "not started: the budget ended first"
                self.log(f"{state.name}: {state.note}")
            return False
        self.give_up_late(now)
        self.admit(now)
        return bool(self.active("waiting", "train", "predict", "reach"))

    def poll(self, state: RunState, now: float) -> None:
        stage = state.stage
        if stage.name == "train":
            updates = latest_updates(stage.log)
            if updates is not None and (not state.samples or updates != state.samples[-1][1]):
                state.samples.append((now, updates))
                state.times.setdefault("first_update", now)
        if stage.proc.poll() is None:
            return
        state.times[f"{stage.name}_end"] = now
        if stage.name == "train" and state.rate():
            self.finished_rates.append(state.rate())
        self.advance(state, self.finish_stage(state, stage), now)

    def advance(self, state: RunState, next_stage: str, now: float) -> None:
        while next_stage not in ("done", "failed"):
            stage = self.start_stage(state, next_stage)
            if stage is not None:
                state.stage, state.status = stage, next_stage
                # a stage may have been launched before the controller takes it over (qa-reach beside qa-predict)
                state.times.setdefault(f"{next_stage}_start", now)
                return
            next_stage = "done"  # a stage that does not fit is skipped (reach only: start_stage says why)
        state.status, state.stage = next_stage, None
        self.log(f"{state.name}: {next_stage}{' (' + state.note + ')' if state.note else ''}")

    def training(self) -> list[RunState]:
        return self.active("train")

    def measured(self, state: RunState) -> bool:
        """Whether the run's rate rests on updates logged over at least ``min_span_s`` seconds."""
        return state.rate() is not None and state.samples[-1][0] - state.samples[0][0] >= self.min_span_s

    def give_up_late(self, now: float) -> None:
        if now - self.last_give_up < self.cooldown_s:
            return
        late = [s for s in self.training() if self.measured(s) and s.projected_end(now) > self.stop_at]
        if not late:
            return
        victim = max(self.training(), key=lambda s: s.priority)
        end = victim.projected_end(now)
        stop(victim.stage)
        victim.status, victim.stage = "given_up", None
        victim.note = (
            f"given up at update {victim.done_updates()} of {victim.updates}: {len(late)} run(s) projected past the "
            f"stop time ({', '.join(s.name for s in late)}); its own end "
            + (f"{end - self.stop_at:+.0f} s from the stop time" if end is not None else "not yet projected")
        )
        self.last_give_up = now
        for state in self.training():
            state.since = now
        self.log(f"{victim.name}: {victim.note}")

    def admit(self, now: float) -> None:
        waiting = self.active("waiting")
        if not waiting or now - self.last_give_up < self.cooldown_s:
            return
        running = self.training()
        rates = [s.rate() for s in running] if all(self.measured(s) for s in running) else []
        rates = rates or ([] if running else self.finished_rates)
        if not rates:  # nothing to project with yet: fill up to the initial number of runs
            for state in waiting[: max(0, self.initial - len(self.active("train", "predict", "reach")))]:
                self.start(state, now)
            return
        rates = [rate for rate in rates if rate > 0]
        if not rates:  # measured, but no run has advanced in its window (a loaded machine): nothing to project with
            return
        # the next run shares the device with the running ones; alone (only finished rates to go by) it has it all
        slowdown = len(running) / (len(running) + 1) if running else 1.0
        startups = [s.times["first_update"] - s.times["train_start"] for s in self.states if "first_update" in s.times]
        startup = sum(startups) / len(startups) if startups else self.startup_s
        nxt = waiting[0]
        own_end = now + startup + nxt.updates / (sum(rates) / len(rates) * slowdown) + nxt.scoring_s
        if own_end <= self.stop_at and all(s.projected_end(now, slowdown) <= self.stop_at for s in running):
            self.start(nxt, now)

    def start(self, state: RunState, now: float) -> None:
        state.times["train_start"] = now
        self.advance(state, "train", now)
        self.log(f"{state.name}: started ({len(self.training())} training)")
