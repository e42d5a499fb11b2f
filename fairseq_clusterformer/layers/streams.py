"""Random numbers a long-range layer draws for itself (Cluster-Former's initial centroids, LSH's training rotations):
from a generator of its own, seeded from torch's seed, never from torch's global stream.

Why: a layer that drew from the global stream would move every later draw of the run - the QA heads' initial weights
(built after the encoder), every dropout mask - so a long-range run and the sliding-window run of the same ``--seed``
would differ in more than their long-range layers. Drawn from streams of their own, a hybrid layer (its gate starts
at 0) leaves the run at update 0 exactly the sliding-window run of its seed, heads included, and a paired
comparison of the two compares what the layers do, not two random starts.

A draw's seed mixes ``torch.initial_seed()`` (what was last given to ``torch.manual_seed``: fairseq's ``--seed`` when
the model is built, ``--seed`` + the number of updates at every training step, which it seeds again), the layer's
``stream`` (its 1-based position in the model: two layers draw different numbers) and how many draws the layer made
since torch was seeded with another value. Reading ``initial_seed()`` draws nothing, so the global stream is left
exactly as the sliding-window model leaves it. A resumed run draws what the uninterrupted one drew, because fairseq
seeds every update anew. Seeding torch again with the value it already had does not restart the count (the layer
cannot tell that from no seeding at all): ``restart()`` does.
"""

from __future__ import annotations

import torch

_MODULUS = 2**63  # torch.Generator.manual_seed takes 64-bit seeds; a non-negative int64 fits every torch version


def stream_seed(stream: int, draw: int = 0, base: int | None = None) -> int:
    """The seed of draw number ``draw`` of layer ``stream``; ``base`` None: torch's current initial seed."""
    base = torch.initial_seed() if base is None else base
    # distinct (stream, draw) pairs of one base give distinct seeds while draw < 7,919 (the count restarts at every
    # update fairseq seeds, so it stays at the micro-batches of one update)
    return ((base % _MODULUS) * 1_000_003 + stream * 7_919 + draw) % _MODULUS


def stream_generator(stream: int, draw: int = 0, device: torch.device | str | None = None) -> torch.Generator:
    """A generator on ``device`` (the CPU for None) seeded for draw ``draw`` of layer ``stream``."""
    return torch.Generator(device=device or "cpu").manual_seed(stream_seed(stream, draw))


class DrawCounter:
    """Counts a layer's draws since torch was last seeded with another value (see the module's docstring).

    Plain Python state: it pickles and deep-copies with the layer (fairseq's EMA copies the model) and is not saved
    in checkpoints, which need it no more than fairseq's own RNG state.
    """

    def __init__(self, stream: int) -> None:
        self.stream = stream
        self.restart()

    def restart(self) -> None:
        """Draw next what the first draw after a fresh ``torch.manual_seed`` draws."""
        self._base: int | None = None
        self._count = 0

    def next_generator(self, device: torch.device | str | None = None) -> torch.Generator:
        base = torch.initial_seed()
        if base != self._base:
            self._base, self._count = base, 0
        generator = stream_generator(self.stream, self._count, device)
        self._count += 1
        return generator
