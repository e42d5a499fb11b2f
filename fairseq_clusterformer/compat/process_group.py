"""A distributed run ends with its process group destroyed.

fairseq 0.12 waits at a barrier once training is over, then leaves the process to exit with its process group still
alive: gloo's (and NCCL's) C++ worker threads then meet an interpreter that is being torn down, and a process can
die of SIGABRT ("terminate called without an active exception") after a run that went well, at random, more often
on a loaded machine. At interpreter exit, while it is still whole, the group is destroyed here. The handler is
registered when the package is imported, before the K-Means module's, so that it runs after the K-Means threads still
in flight were joined (``atexit`` runs the handlers last registered first).
"""

from __future__ import annotations

import atexit

import torch.distributed as dist

_registered = False


def destroy_at_exit() -> None:
    """Destroy the default process group, if one is still there (a script that destroyed its own: nothing to do)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def end_process_group_at_exit() -> None:
    """Register ``destroy_at_exit`` once."""
    global _registered
    if not _registered:
        atexit.register(destroy_at_exit)
        _registered = True
