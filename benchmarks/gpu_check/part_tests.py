"""Part 1: the device-independent tests (the ones taking the ``device`` fixture of tests/conftest.py) on the device.

They compare the layers with the slow loop references (run on the CPU), check causality and padding on the device,
and run the torch K-Means there; ``--device cuda`` makes every one of them move its layer and inputs to the GPU.
"""

from __future__ import annotations

import os
import re

from benchmarks.gpu_check.context import REPO, Context, run_tool

NAME = "tests"
TITLE = "The device-independent tests on the device"
FILES = ["tests/test_layers.py", "tests/test_kmeans.py", "tests/test_properties.py", "tests/test_host_syncs.py"]
FILES += ["tests/test_flex_layers.py"]  # FlexAttention's kernels against the eager layers, gradients included
# expected seconds per size (the driver's --budget-minutes): the tests are the same at every size (30 of them; 27 s
# on a loaded 2-core CPU); on a GPU, CUDA's start and the CPU loop references they compare with come on top
# 49 s on an H100 (2026-11-27), before the FlexAttention tests: 11 layer kinds whose FlexAttention kernels compile on
# the GPU (6 distinct masks, forward and backward; guessed 10 s each, not yet measured)
ESTIMATE_S = {"tiny": 60, "budget": 110, "full": 120}


def run(ctx: Context) -> tuple[dict, str]:
    # the plugin is imported from the repository root (pytest.ini's pythonpath; run_tool runs there)
    # cuBLAS needs this workspace setting before CUDA starts for the deterministic-algorithms test to run its matmuls
    env = {"CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8")}
    args = ["-m", "pytest", *FILES, "-q", "-rfE", "-p", "no:cacheprovider"]
    args += ["-p", "benchmarks.gpu_check.device_tests_only"]
    args += ["--device", ctx.device.type, "--junitxml", ctx.work_dir / "tests-junit.xml"]
    code, out = run_tool(["python", *args], ctx.work_dir / "logs" / "tests.log", ctx.timeout(1800), env=env)
    lines = [line for line in out.splitlines() if line.strip()]
    # the summary line may share its line with a log record written to stderr at exit: keep only pytest's part
    found = [re.search(r"(\d+ (passed|failed|errors?)[^=]*? in [\d.]+s)", line) for line in reversed(lines)]
    summary = next((m.group(1) for m in found if m), "")
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", summary)}
    status = "ok" if code == 0 and counts.get("passed", 0) > 0 else "failed"
    command = f"python {' '.join(map(str, args))}".replace(str(REPO) + "/", "")
    record = {
        "status": status,
        "headline": f"pytest --device {ctx.device.type}: {summary or f'no summary line (exit {code})'}",
        "command": command,
        "exit_code": code,
        "summary_line": summary,
        "counts": counts,
        "failures": failures,
        "output_tail": out[-6000:] if status != "ok" else "",
    }
    markdown = [
        f"Command (repository root; `benchmarks.gpu_check.device_tests_only` keeps the tests that take the `device` "
        f"fixture):\n\n"
        f"    {command}",
        f"Summary line: **{summary or 'none'}** (exit code {code}).",
    ]
    if failures:
        markdown.append("Failures:\n\n" + "\n".join(f"- `{line}`" for line in failures))
    if status != "ok":
        markdown.append("Output tail:\n\n```\n" + out[-3000:] + "\n```")
    return record, "\n\n".join(markdown)
