"""What every part shares: the run's context, the machine's description, timing on the device, result files."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
REPO = BENCHMARKS.parent
PACKAGE = REPO / "fairseq_clusterformer"
# the benchmark scripts import each other as top-level modules (bench_common, layer_scaling, ...)
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from bench_common import console_script, cpu_model  # noqa: E402


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


def gpu_driver() -> str:
    """The NVIDIA driver version, from nvidia-smi (torch does not report it)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"unknown (nvidia-smi: {err})"
    return out.strip().splitlines()[0] if out.strip() else "unknown (nvidia-smi printed nothing)"


def machine(device: torch.device) -> dict:
    """The device's name and driver, and the software: the header of every result file."""
    info = {
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "cpu": cpu_model(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=torch.cuda.get_device_name(device),
            driver=gpu_driver(),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
        )
    else:
        info.update(gpu=f"none: CPU run ({info['cpu']})", driver="none (no CUDA device)")
    try:
        import fairseq

        info["fairseq"] = fairseq.__version__
    except ImportError:
        info["fairseq"] = "not installed"
    return info


def machine_line(info: dict) -> str:
    return (
        f"GPU: **{info['gpu']}**, driver {info['driver']}; torch {info['torch']} (CUDA {info['cuda']}), "
        f"fairseq {info['fairseq']}, Python {info['python']}, CPU {info['cpu']}; {info['date_utc']}."
    )


def write_part(ctx: Context, name: str, title: str, record: dict, markdown: str) -> None:
    """``<name>.json`` (the record with the machine) and ``<name>.md`` (the machine line, then ``markdown``)."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    (ctx.out_dir / f"{name}.json").write_text(json.dumps({"machine": ctx.machine, **record}, indent=2) + "\n")
    (ctx.out_dir / f"{name}.md").write_text(f"# {title}\n\n{machine_line(ctx.machine)}\n\n{markdown.strip()}\n")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(step, device: torch.device, warmup: int, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``step()`` after ``warmup`` untimed ones: CUDA events around the
    call on a GPU (the GPU's time, not the time to queue its kernels), the wall clock on a CPU."""
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1000)
        else:
            begin = time.perf_counter()
            step()
            times.append(time.perf_counter() - begin)
    return times


def peak_bytes(step, device: torch.device) -> int | None:
    """Peak device memory of one ``step()`` above what was allocated before it (None on a CPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


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
