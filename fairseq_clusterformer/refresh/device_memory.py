"""How much memory a device has free: the memory bank checks its allocation against it."""

import torch


def free_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on ``device`` (the CPU: Linux's MemAvailable), or None when unknown."""
    if device.type == "cuda":
        # what the driver has free, plus what torch's caching allocator holds reserved but unused
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
    except OSError:
        return None
    available = fields.get("MemAvailable", "").split()  # "21312345 kB"
    return int(available[0]) * 1024 if available else None
