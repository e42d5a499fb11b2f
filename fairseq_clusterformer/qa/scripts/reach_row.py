"""One row of fairseq-clusterformer-qa-reach's table (qa/scripts/reach.py): a long-range layer or the sliding window,
its question tokens' key counts gathered example by example and averaged into the row's statistics at the end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fairseq_clusterformer.ops import cluster_stats as stats


@dataclass
class Row:
    """One row of the table: a long-range layer, or the sliding window; per-question values, averaged at the end."""

    name: str
    kind: str
    clusters: int = 0  # P, 0 for the sliding window
    paragraph: list[tuple[float, float]] = field(default_factory=list)  # (share, uniform share) per question
    outside: list[float] = field(default_factory=list)
    outside_paragraph: list[tuple[float, float]] = field(default_factory=list)
    keys: list[float] = field(default_factory=list)  # attended keys per question token
    sizes: list[tuple[float, float, int]] = field(default_factory=list)  # size_summary per example
    gates: list[float] | None = None  # a hybrid layer's tanh(gain * g) per head: how much far attention it adds

    def add(self, pairs: Tensor, own_window: Tensor, context: Tensor, paragraph: Tensor, uniform: float) -> None:
        """pairs / own_window: 1 x N x S (the question tokens' rows); context / paragraph: 1 x S key sets."""
        queries = torch.ones(pairs.shape[:2], dtype=torch.bool, device=pairs.device)  # 1 x N: every row is one
        outside = ~own_window  # 1 x N x S
        sets = [[], [context], [paragraph], [outside], [outside, context], [outside, paragraph]]
        counts = stats.keys_inside(pairs, queries, sets)[0].tolist()
        every, in_context, in_paragraph, out, out_context, out_paragraph = counts
        self.keys.append(every / pairs.size(1))
        if every:
            self.outside.append(out / every)
        if in_context:
            self.paragraph.append((in_paragraph / in_context, uniform))
        if out_context:
            self.outside_paragraph.append((out_paragraph / out_context, uniform))

    def summary(self) -> dict[str, Any]:
        def mean(values: list[float]) -> float | None:
            return sum(values) / len(values) if values else None

        out: dict[str, Any] = {
            "layer": self.name,
            "kind": self.kind,
            "questions": len(self.paragraph),
            "paragraph_share": mean([s for s, _ in self.paragraph]),
            "uniform_share": mean([u for _, u in self.paragraph]),
            "outside_window_share": mean(self.outside),
            "outside_window_questions": len(self.outside_paragraph),
            "outside_window_paragraph_share": mean([s for s, _ in self.outside_paragraph]),
            "outside_window_uniform_share": mean([u for _, u in self.outside_paragraph]),
            "keys_per_question_token": mean(self.keys),
        }
        if self.gates is not None:
            out.update(far_gates=self.gates, mean_abs_far_gate=mean([abs(g) for g in self.gates]))
        if self.clusters:
            out.update(
                clusters=self.clusters,
                entropy_bits=mean([e for e, _, _ in self.sizes]),
                max_entropy_bits=float(torch.log2(torch.tensor(float(self.clusters)))),
                largest_share=mean([s for _, s, _ in self.sizes]),
                empty_clusters=mean([float(n) for _, _, n in self.sizes]),
            )
        return out
