"""The QA runs of the device call (benchmarks/qa_device/device_run.sh starts this after installing the bundle).

    python -m benchmarks.qa_device --payload .qa-device --work /tmp/run --results DIR --stop-at EPOCH_SECONDS \
        [--seeds 1,2] [--kinds none,cluster-layer6,lsh-layer6,sparse-layer6,cluster-layer5] [--no-table-a] \
        [--parallel 8] [--tiny]

Unpacks the payload that benchmarks/qa_device/prepare.sh made (checked against its SHA256SUMS), skips every run whose
RESULTS/NAME/summary.json already holds its settings (an earlier call's, committed), trains, scores and measures the
others side by side (schedule.py decides what starts and what is given up), and writes each finished run's folder as
soon as it is scored. Then RESULTS/runs.json (every run's state over all calls) and the report (report.md / .json,
by benchmarks.qa_report.table). --tiny: the CPU dry run's sizes; it refuses to write into
benchmarks/results/, which holds a GPU's results only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from benchmarks.qa_device.runs import (
    DEFAULT_KINDS,
    KINDS,
    REACH_QUESTIONS,
    REPO,
    VARIANTS,
    Paths,
    Run,
    measure_command,
    plan,
    predict_command,
    train_command,
)
from benchmarks.qa_device.schedule import Controller, RunState, Stage, latest_updates, launch, stop

# qa-predict's seconds on the GPU, as the first call measured them with its runs side by side (102 s and 28 s)
SCORING_S = {"article": 105.0, "paragraph": 30.0}
# qa-reach on REACH_QUESTIONS whole articles, one at a time: the first call guessed 150 s for all 1,589; its start-up
# and some contention added (not started without this much time left)
REACH_S = 150.0 * REACH_QUESTIONS / 1589 + 30.0
# the ablation: three passes over the same questions, each about qa-predict's time for them, and its start-up
ABLATION_S = 3 * SCORING_S["article"] * REACH_QUESTIONS / 1589 + 30.0
RUN_FILES = ("train.log", "eval.log", "valid.pred.json", "reach.json", "reach.log", "cluster_ablation.json",
             "cluster_ablation.log")  # fmt: skip


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qa_device", description=__doc__.split("\n")[0])
    parser.add_argument("--payload", type=Path, required=True, help="what prepare.sh wrote (.qa-device)")
    parser.add_argument("--work", type=Path, required=True, help="checkpoints and logs of this call")
    parser.add_argument("--results", type=Path, required=True, help="finished runs' folders, kept across calls")
    parser.add_argument("--stop-at", type=float, required=True, help="epoch seconds at which every run is stopped")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--kinds", default=DEFAULT_KINDS, help=f"variants, of: {', '.join(VARIANTS)}")
    parser.add_argument("--no-table-a", action="store_true", help="leave out table a's GPU re-run (paragraphs)")
    parser.add_argument("--parallel", type=int, default=8, help="runs started before any rate is measured")
    parser.add_argument("--threads", type=int, default=2, help="OMP threads of each run")
    parser.add_argument("--squad", type=Path, default=REPO / "examples/data/squad/dev-v1.1.json")
    parser.add_argument("--held-out-from", type=int, default=40, help="first held-out article of --squad")
    parser.add_argument("--tiny", action="store_true", help="the CPU dry run's sizes")
    return parser


def unpack(payload: Path, work: Path) -> Path:
    """Check every payload file against SHA256SUMS and unpack data.tar.xz into WORK/data."""
    sums = payload / "SHA256SUMS"  # there: check_flags looked
    for line in sums.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        # read whole (at most a few tens of MB); hashlib.file_digest needs Python 3.11, and importing the project
        # here would cost the driver torch's start-up
        if hashlib.sha256((payload / name.lstrip("*")).read_bytes()).hexdigest() != digest:
            raise SystemExit(f"{payload}/{name}: its SHA-256 differs from SHA256SUMS; run prepare.sh again")
    (work / "data").mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(payload / "data.tar.xz") as tar:
            # our own archive; the "data" filter (Python >= 3.10.12) refuses links out of the folder all the same
            tar.extractall(work / "data", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    except tarfile.CompressionError:  # a Python built without lzma: the system's tar and xz
        subprocess.run(["tar", "-xJf", str(payload / "data.tar.xz"), "-C", str(work / "data")], check=True)
    return work / "data"


def device_name() -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
        return subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "cpu (no nvidia-smi)"


def monitor(path: Path, done: threading.Event) -> None:
    """GPU utilisation and memory every 5 s into ``path`` (CSV), until ``done``."""
    query = ["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,memory.used,memory.total",
             "--format=csv,noheader,nounits"]  # fmt: skip
    with open(path, "a", encoding="utf-8") as f:
        f.write("timestamp, utilization %, memory used MiB, memory total MiB\n")
        while not done.wait(5.0):
            try:
                f.write(subprocess.run(query, capture_output=True, text=True, timeout=20).stdout)
                f.flush()
            except (OSError, subprocess.SubprocessError):
                return


def finished_earlier(results: Path, run: Run, settings: dict) -> dict | None:
    path = results / run.name / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return summary if summary.get("settings") == settings else None


def scores_of(eval_log: Path) -> dict:
    """EM / F1 from qa-predict's last output line (its JSON) and the answered count from its report line."""
    text = eval_log.read_text(encoding="utf-8", errors="replace")
    scores = json.loads(text.strip().splitlines()[-1])
    answered = re.search(r"\| valid: (\d+) of (\d+) questions answered", text)
    return {**scores, "answered": int(answered[1]), "questions": int(answered[2])}


class Call:
    """The callbacks of the controller: what each stage runs, and what a finished stage leaves."""

    def __init__(self, args: argparse.Namespace, paths: Paths, stamp: str, device: str, log) -> None:
        self.args, self.paths, self.stamp, self.device, self.log = args, paths, stamp, device, log
        self.runs: dict[str, Run] = {}
        self.stop_at = args.stop_at
        self.beside: dict[str, Stage] = {}  # qa-reach stages started beside their run's qa-predict

    def start_stage(self, state: RunState, name: str) -> Stage | None:
        run, folder = self.runs[state.name], self.paths.work / state.name
        if name == "train":
            command, env = train_command(run, self.paths, self.args.tiny, self.args.threads)
            return launch(name, command, folder / "train.log", env)
        if name == "predict":
            if state.reach:
                # qa-reach (and the ablation) beside qa-predict: all only read the finished checkpoint, and one
                # after the other they would not fit before the stop (the first call's scoring ended 28 s before it)
                needed = REACH_S * run.reach + ABLATION_S * run.ablation
                if time.time() + (5 if self.args.tiny else needed) > self.stop_at:
                    state.note = "reach and ablation not started: too little time left"
                else:
                    measure = measure_command(run, self.paths, self.args.tiny, folder)
                    self.beside[state.name] = launch("reach", measure, folder / "measure.log")
                    state.times["reach_start"] = time.time()
            return launch(name, predict_command(run, self.paths, self.args.tiny, folder / "valid.pred.json"),
                          folder / "eval.log")  # fmt: skip
        # the controller waits for (and at the stop time ends) the qa-reach started beside qa-predict
        return self.beside.pop(state.name, None)

    def end_beside(self) -> None:
        """Stop the qa-reach stages nobody waits for any more: their run's qa-predict failed or was stopped."""
        for stage in self.beside.values():
            stop(stage)
        self.beside.clear()

    def finish_stage(self, state: RunState, stage: Stage) -> str:
        code, folder = stage.proc.returncode, self.paths.work / state.name
        if stage.name == "train":
            done = latest_updates(stage.log) or 0
            if code == 0 and done >= state.updates:
                return "predict"
            state.note = f"training exited with status {code} at update {done} of {state.updates}"
            return "failed"
        if stage.name == "predict":
            if code != 0 or not (folder / "valid.pred.json").is_file():
                state.note = f"qa-predict exited with status {code}"
                return "failed"
            self.publish(state)
            return "reach"
        if code != 0:
            state.note = f"qa-reach or the ablation exited with status {code} (reach.log, cluster_ablation.log)"
        self.publish(state)
        return "done"

    def publish(self, state: RunState) -> None:
        """RESULTS/NAME: the run's logs, predictions, reach statistics and summary.json, as soon as it is scored."""
        run, folder = self.runs[state.name], self.paths.work / state.name
        out = self.paths.results / state.name
        out.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, out / name)
        times = state.times
        seconds = {k: round(times[f"{k}_end"] - times[f"{k}_start"], 1)
                   for k in ("train", "predict", "reach") if f"{k}_end" in times}  # fmt: skip
        train_log = (folder / "train.log").read_text(encoding="utf-8", errors="replace")
        summary = {"run": state.name, "settings": run.settings(self.args.tiny), **scores_of(folder / "eval.log"),
                   "updates": latest_updates(folder / "train.log"), "device": self.device, "call": self.stamp,
                   "seconds": seconds, "startup_s": round(times.get("first_update", 0) - times["train_start"], 1),
                   "updates_per_s_at_end": state.rate(), "oom_lines": train_log.lower().count("out of memory"),
                   "reach": (out / "reach.json").is_file(),
                   "reach_questions": REACH_QUESTIONS if (out / "reach.json").is_file() else 0,
                   "cluster_ablation": (out / "cluster_ablation.json").is_file()}  # fmt: skip
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def check_flags(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    """The seeds and kinds, and the payload's presence, checked before any folder is made or anything unpacked."""
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise SystemExit(f"--kinds {args.kinds}: unknown kind {', '.join(unknown)} (the kinds: {', '.join(KINDS)})")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds {args.seeds}: expected whole numbers separated by commas") from None
    if not (args.payload / "SHA256SUMS").is_file():
        raise SystemExit(f"--payload {args.payload}: no SHA256SUMS; make it with benchmarks/qa_device/prepare.sh")
    return seeds, kinds


def main(args: argparse.Namespace) -> int:
    results = args.results.resolve()
    if args.tiny and (REPO / "benchmarks/results") in (results, *results.parents):
        raise SystemExit(f"--results {args.results}: a --tiny run does not write into benchmarks/results/")
    seeds, kinds = check_flags(args)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    call_dir = results / "calls" / stamp
    call_dir.mkdir(parents=True, exist_ok=True)
    log_file = open(call_dir / "schedule.log", "a", encoding="utf-8")

    def log(message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    args.work.mkdir(parents=True, exist_ok=True)
    data = unpack(args.payload, args.work)
    paths = Paths(data=data, encoder=args.payload / "encoder", work=args.work, results=results)
    device = device_name()
    call = Call(args, paths, stamp, device, log)
    states = []
    for priority, run in enumerate(plan(seeds, kinds, not args.no_table_a)):
        settings = run.settings(args.tiny)
        earlier = finished_earlier(results, run, settings)
        if earlier is not None:
            log(f"{run.name}: finished in call {earlier['call']} (EM {earlier['exact_match']:.2f}): not run again")
            continue
        call.runs[run.name] = run
        scoring = 10.0 if args.tiny else SCORING_S[run.contexts]
        states.append(RunState(run.name, priority, settings["updates"], scoring, run.measured))
    log(f"device: {device}; {len(states)} run(s) to do; stop at +{args.stop_at - time.time():.0f} s")
    controller = Controller(states, args.stop_at, args.parallel, call.start_stage, call.finish_stage, log,
                            cooldown_s=3 if args.tiny else 30, min_span_s=0 if args.tiny else 20,
                            startup_s=10 if args.tiny else 60)  # fmt: skip
    done = threading.Event()
    if not device.startswith("cpu"):
        threading.Thread(target=monitor, args=(call_dir / "gpu.csv", done), daemon=True).start()
    while controller.step(time.time()):
        time.sleep(0.5 if args.tiny else 2.0)
    call.end_beside()
    done.set()
    write_runs(results, states, stamp, device)
    for state in states:
        if state.status != "done" and (paths.work / state.name / "train.log").is_file():
            shutil.copyfile(paths.work / state.name / "train.log", call_dir / f"{state.name}.train.log")
    report = [sys.executable, "-m", "benchmarks.qa_report.table", "--results", str(results),
              "--squad", str(args.squad), "--held-out-from", str(args.held_out_from),
              "--markdown", str(results / "report.md"), "--json", str(results / "report.json")]  # fmt: skip
    code = subprocess.run(report, cwd=REPO).returncode
    log(f"report: exit status {code}; " + ", ".join(f"{s.name} {s.status}" for s in states))
    return 0 if code == 0 and all(s.status == "done" for s in states) else 3


def write_runs(results: Path, states: list[RunState], stamp: str, device: str) -> None:
    """RESULTS/runs.json: every run's last state, this call's over the earlier calls' entries."""
    path = results / "runs.json"
    runs = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    for s in states:
        start = s.times.get("train_start", 0)
        runs[s.name] = {"status": s.status, "call": stamp, "device": device, "note": s.note,
                        "updates": s.done_updates(), "of": s.updates,
                        "times_s": {k: round(v - start, 1) for k, v in s.times.items()}}  # fmt: skip
    path.write_text(json.dumps(runs, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main(get_parser().parse_args()))
