"""The ``layers`` part's ``--profile-layers``: where one forward+backward of a layer spends its time, kernel by kernel.

Why: at T = 32,768 on an H200 the compiled sliding window (4.60 ms) and Cluster-Former layer (4.35 ms) took 1.3x
FlexAttention's sliding window (3.40 ms), and the FlexAttention Cluster-Former layer 10.5 ms; the time per pass says
that, not where it goes. Each case here runs two warm-up passes (the first compiles for the case's shape) and then
``PASSES`` passes under ``torch.profiler``; the summary is per pass: the device time and launches of all kernels
together, and the ``TOP`` kernels by device time (on a CPU, the dry run of the test suite: the ATen ops by CPU
time, which says nothing of a GPU but runs the same code).
"""

from __future__ import annotations

import torch
from torch.autograd import DeviceType

# (kind, variant): the paper's sliding window compiled (4.60 ms at 32k on the H200), the same as a band (the
# reference's pattern: one FFN pass per token instead of two), the Cluster-Former layer compiled (4.35 ms) and with
# FlexAttention (10.5 ms), and the reference, FlexAttention's sliding window (3.40 ms)
PROFILED = [
    ("window", "compiled"),
    ("window band", "compiled"),
    ("cluster-strict", "compiled"),
    ("cluster-strict", "flex"),
    ("flex-window", "eager"),
]
PASSES, TOP = 3, 12


def _self_time_us(event, cuda: bool) -> float:
    if not cuda:
        return event.self_cpu_time_total
    # torch >= 2.4 says device, older torch cuda
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)


def summarise(prof, cuda: bool, passes: int) -> dict:
    """Per pass: the total time and calls of the kernels (CUDA) or ATen ops (CPU), and the top ``TOP`` of them."""
    rows = []
    for event in prof.key_averages():
        on_device = event.device_type == DeviceType.CUDA if cuda else event.key.startswith("aten::")
        spent = _self_time_us(event, cuda)
        if on_device and spent > 0:
            rows.append({"name": event.key[:120], "calls": event.count / passes, "ms": spent / 1000 / passes})
    rows.sort(key=lambda r: -r["ms"])
    total = sum(r["ms"] for r in rows)
    for row in rows:
        row["share"] = row["ms"] / total if total else 0.0
    return {
        "what": "CUDA kernels" if cuda else "ATen ops (CPU)",
        "ms_per_pass": total,
        "calls_per_pass": sum(r["calls"] for r in rows),
        "top": rows[:TOP],
    }


def profile_step(step, device: torch.device) -> dict:
    """``step`` (one forward+backward) warmed up, then profiled over ``PASSES`` passes."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    for _ in range(2):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(PASSES):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    return summarise(prof, cuda, PASSES)


def render(cases: list[dict], length: int) -> str:
    """The profile section of ``layers.md``."""
    lines = [
        f"## Profile at T = {length}",
        __doc__.split("\n\n", 1)[1].strip(),
    ]
    for case in cases:
        title = f"**{case['kind']} ({case['variant']})**"
        if "profile" not in case:
            lines.append(f"{title}: {case.get('skipped') or 'error: ' + case.get('error', '')[:200]}")
            continue
        p = case["profile"]
        rows = [f"| {r['name']} | {r['calls']:.0f} | {r['ms']:.3f} | {r['share']:.0%} |" for r in p["top"]]
        lines.append(
            f"{title}: {p['ms_per_pass']:.2f} ms of {p['what']} a pass, {p['calls_per_pass']:.0f} calls\n\n"
            "| kernel | calls | ms | share |\n| --- | --- | --- | --- |\n" + "\n".join(rows)
        )
    return "\n\n".join(lines)
