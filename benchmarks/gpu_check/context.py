"""What every part of gpu-check shares: the run's context (sizes, budget, folders), the tools it runs, the data,
the result files and their verdicts. The machine's description and the timing are benchmarks/common.py's."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import REPO, console_script
from benchmarks.machine import device_line

PACKAGE = REPO / "fairseq_clusterformer"


@dataclasses.dataclass
class Context:
    out_dir: Path  # Markdown + JSON results
    work_dir: Path  # data, checkpoints, logs
    device: torch.device
    tiny: bool  # CPU-sized cases (what the test suite runs)
    machine: dict  # `machine()`: written into every file
    size: str = ""  # "tiny", "budget" (cut to fit --budget-minutes) or "full"; "" means tiny or full as `tiny` says
    deadline: float | None = None  # time.monotonic() at which --budget-minutes is spent; None: no budget
    # what narrows a run to some questions (``--layer-kinds``, ``--profile-layers``, ``--train-flags``): by option name
    options: dict = dataclasses.field(default_factory=dict)

    @property
    def budget(self) -> bool:
        """True when the parts run their cut-down sizes (chosen so that the run fits --budget-minutes)."""
        return self.size == "budget"

    def seconds_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def timeout(self, seconds: float) -> float:
        """``seconds``, or less when the budget ends sooner: a subprocess is stopped when the budget is spent (with a
        short grace for it to write its logs), so that the whole run stays inside the device call that runs it."""
        return max(1.0, min(seconds, self.seconds_left() + 30))


def write_part(ctx: Context, name: str, title: str, record: dict, markdown: str) -> None:
    """``<name>.json`` (the record with the machine) and ``<name>.md`` (the machine line, then ``markdown``)."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    (ctx.out_dir / f"{name}.json").write_text(json.dumps({"machine": ctx.machine, **record}, indent=2) + "\n")
    (ctx.out_dir / f"{name}.md").write_text(f"# {title}\n\n{device_line(ctx.machine)}\n\n{markdown.strip()}\n")


def run_tool(args: list, log: Path, timeout: float, env: dict | None = None) -> tuple[int, str]:
    """Run a console script of this environment (fairseq-train, ...) or ``python``; output to ``log`` and back."""
    tool = sys.executable if args[0] == "python" else console_script(args[0])
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            [tool, *map(str, args[1:])],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        code, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as err:
        code, out = 124, f"{err.output or ''}\n{args[0]} timed out after {timeout:.0f} s"
    log.write_text(out if isinstance(out, str) else out.decode(errors="replace"))
    return code, log.read_text()


def lm_data(ctx: Context) -> Path:
    """The committed WikiText-2 slice binarised by fairseq-preprocess into the work dir (once per run)."""
    text = REPO / "examples" / "data" / "wikitext-2-slice"
    dest = ctx.work_dir / "wikitext-2-slice-bin"
    if (dest / "dict.txt").exists():
        return dest
    code, out = run_tool(
        ["fairseq-preprocess", "--only-source", "--trainpref", text / "train.txt", "--validpref", text / "valid.txt"]
        + ["--testpref", text / "test.txt", "--destdir", dest, "--workers", "1"],
        ctx.work_dir / "logs" / "preprocess.log",
        timeout=ctx.timeout(600),
    )
    if code != 0:
        raise RuntimeError(f"fairseq-preprocess failed ({code}): {out[-2000:]}")
    return dest


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def markdown_escape(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
