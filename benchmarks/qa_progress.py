"""The progress record of a run longer than one sitting: what a later session needs to continue it exactly, or to
know that it must start it again.

    python -m benchmarks.qa_progress record RUN --updates 1400 \
        --command "env ... bash examples/qa/cpu_pretrained.sh ..." \
        --record benchmarks/results/qa_pretrained/cpu_budget/progress/RUN_NAME.json
    python -m benchmarks.qa_progress check RUN --record benchmarks/results/.../RUN_NAME.json

A run of examples/qa/cpu_pretrained.sh resumes from RUN/checkpoint_last.pt with the same command (fairseq restores
the weights, the optimizer, the data order and the random state; the plug-in its centroids, banks and refresh
counters), to the weights an uninterrupted run reaches. The run folder lives outside the work tree, on a machine a
later session may or may not get back, so the record (committed) says how far it got: the updates done, the
checkpoint's SHA-256 and size, the hours trained, the CPU and its float32 / bfloat16 product rates, the command and
the code's commit.

``check`` compares the record with what is on disk and prints one verdict line (exit 0):
- ``continue``: the checkpoint is the recorded one (same SHA-256), or one the same run saved later (more updates);
- ``restart``: no checkpoint is there (another machine, or the folder was lost): the same command trains the run
  again from update 0; nothing of the lost run is mixed into it;
- ``finished``: the checkpoint has the record's planned updates.
A checkpoint that is neither (fewer updates than recorded, or the recorded number of updates with other bytes) is
another run: exit 2, naming both, and nothing is continued.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.machine import cpu_model, matmul_record
from fairseq_clusterformer.qa.hf.weights import sha256 as file_sha256

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = "checkpoint_last.pt"


def fail(message: str) -> None:
    print(f"qa_progress.py: {message}", file=sys.stderr)
    sys.exit(2)


def saved_progress(checkpoint: Path) -> tuple[int, float]:
    """(updates, hours trained) saved in a fairseq checkpoint, read as the recipe reads them."""
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "checkpoint_progress.py"), str(checkpoint)],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        fail(proc.stderr.strip() or f"{checkpoint}: cannot be read")
    updates, hours = proc.stdout.split()
    return int(updates), float(hours)


def code_commit(code: Path) -> str:
    proc = subprocess.run(["git", "-C", str(code), "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def record(args: argparse.Namespace) -> dict:
    checkpoint = args.run / CHECKPOINT
    if not checkpoint.is_file():
        fail(f"{checkpoint}: no checkpoint to record (has the run saved one yet?)")
    if args.record.exists() and not args.record.is_file():
        fail(f"--record {args.record}: not a file")
    updates, hours = saved_progress(checkpoint)
    entry = {
        "run": args.run.name,
        "folder": str(args.run),
        "updates_done": updates,
        "updates_planned": args.updates,
        "hours_trained": hours,
        "checkpoint": CHECKPOINT,
        "checkpoint_sha256": file_sha256(checkpoint),
        "checkpoint_bytes": checkpoint.stat().st_size,
        "cpu": cpu_model(),
        "matmul_gflops_one_thread": matmul_record(),
        "command": args.command,
        "code_commit": code_commit(args.code),
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(json.dumps(entry, indent=1) + "\n", encoding="utf-8")
    print(f"| {args.run.name}: update {updates} of {args.updates}, {hours:.2f} h, sha256 "
          f"{entry['checkpoint_sha256'][:12]} -> {args.record}")  # fmt: skip
    return entry


def check(args: argparse.Namespace) -> str:
    try:
        entry = json.loads(args.record.read_text(encoding="utf-8"))
        recorded, planned, sha = entry["updates_done"], entry["updates_planned"], entry["checkpoint_sha256"]
    except (OSError, ValueError, KeyError) as error:
        fail(f"--record {args.record}: not a progress record ({error})")
    checkpoint = args.run / CHECKPOINT
    if not checkpoint.exists():
        verdict = (f"restart: {checkpoint} is not there (the record has update {recorded}, sha256 {sha[:12]}); the "
                   "same command trains the run again from update 0")  # fmt: skip
    else:
        updates, _ = saved_progress(checkpoint)
        if updates == recorded and file_sha256(checkpoint) != sha:
            fail(f"{checkpoint}: update {updates} as recorded, but other bytes than the record's sha256 {sha[:12]}: "
                 f"another run's checkpoint; move it away to restart this run, or give this run's folder")  # fmt: skip
        if updates < recorded:
            fail(f"{checkpoint}: update {updates}, behind the record's {recorded} ({args.record}): an older or "
                 "another run's checkpoint; nothing is continued")  # fmt: skip
        state = "finished" if updates >= planned else "continue"
        verdict = f"{state}: {checkpoint} at update {updates} of {planned} (recorded: {recorded})"
    print(verdict)
    return verdict.split(":")[0]


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="action", required=True)
    for name, helps in (("record", "write RUN's progress record"), ("check", "continue, restart or finished?")):
        sub = commands.add_parser(name, help=helps)
        sub.add_argument("run", type=Path, help="the run folder (holding checkpoint_last.pt once it has saved)")
        sub.add_argument("--record", type=Path, required=True, help="the progress record (JSON)")
        if name == "record":
            sub.add_argument("--updates", type=int, required=True, help="the updates the run is to reach")
            sub.add_argument("--command", required=True, help="the command that runs and resumes it")
            sub.add_argument("--code", type=Path, default=REPO, help="the checkout the run's code comes from")
    return parser


def main(argv: list[str] | None = None) -> str | dict:
    args = get_parser().parse_args(argv)
    return record(args) if args.action == "record" else check(args)


if __name__ == "__main__":
    main()
