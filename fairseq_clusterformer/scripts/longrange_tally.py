"""Bookkeeping of the long-range breakdown: losses per distance bucket, and which keys the long-range layers gave.

L = tokens of one input, R = scored tokens of one block, N = tokens of the split.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import Tensor

from fairseq_clusterformer.modules.sorted_window_layer import SortedWindowLayer
from fairseq_clusterformer.ops import cluster_stats as stats
from fairseq_clusterformer.ops.recurrence import (
    BEYOND_REACH,
    BUCKETS,
    distance_buckets,
    log2_bins,
    previous_occurrence,
    random_hit_chance,
)


class LayerCapture:
    """Forward hooks on every long-range layer of a Cluster-Former decoder: after each forward, ``pairs`` maps the
    layer number (1-based) to the L x L keys each query of the input may attend to (any head)."""

    def __init__(self, model) -> None:
        self.pairs: dict[int, Tensor] = {}
        self.kinds: dict[int, str] = {}
        self.handles = []
        for index, layer in enumerate(getattr(model.decoder, "layers", [])):
            if isinstance(layer, SortedWindowLayer):
                self.kinds[index + 1] = f"{type(layer).__name__} ({layer.causality})"
                self.handles.append(layer.register_forward_hook(self.hook(index + 1)))

    def hook(self, number: int):
        def record(layer: SortedWindowLayer, inputs: tuple, output: Tensor) -> None:
            x = inputs[0]
            padding_mask = inputs[1] if len(inputs) > 1 else None
            ids = layer.group_ids(x, padding_mask)  # 1 x L, the same assignment the forward pass used
            pairs = torch.zeros(1, x.size(1), x.size(1), dtype=torch.bool, device=x.device)  # 1 x L x L
            for q_pos, k_pos, allowed in layer.attention_layouts(ids, padding_mask):  # one per head set
                pairs |= stats.attended_pairs(q_pos, k_pos, allowed, x.size(1))
            self.pairs[number] = pairs[0].cpu()

        return record

    def clear(self) -> None:
        self.pairs.clear()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class Sums:
    """Token count and summed loss (nats) of one row of a table."""

    def __init__(self) -> None:
        self.tokens, self.loss = 0, 0.0

    def add(self, losses: Tensor) -> None:
        self.tokens += losses.numel()
        self.loss += float(losses.double().sum())

    def row(self) -> dict:
        mean = self.loss / self.tokens if self.tokens else float("nan")
        return {"tokens": self.tokens, "loss_nats": mean, "loss_base2": mean / math.log(2)}


class Tally:
    def __init__(self, stream: Tensor, documents: Tensor, reach: int) -> None:
        self.previous = previous_occurrence(stream, documents)  # N
        self.reach = reach
        self.total = Sums()
        self.buckets = [Sums() for _ in BUCKETS]
        self.bins: dict[int, Sums] = defaultdict(Sums)
        self.hits: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # layer -> hits, chance, keys
        self.far_tokens = 0
        self.any_hits = 0
        self.kinds: dict[int, str] = {}

    def add(self, targets: Tensor, scores: Tensor, input_start: int, capture: LayerCapture, first: int) -> None:
        """targets: R stream positions; scores: R log-probs; input_start: first stream position the input showed;
        first: the input's first x position (x = [eos] + stream), which maps stream positions to query rows."""
        losses = -scores
        starts = torch.full_like(targets, input_start)
        buckets = distance_buckets(targets, self.previous, starts, self.reach)  # R
        self.total.add(losses)
        for number in range(len(BUCKETS)):
            self.buckets[number].add(losses[buckets == number])
        before = self.previous[targets]
        seen = before >= input_start  # the earlier occurrence is in the input
        bins = log2_bins(targets - before)
        for b in bins[seen].unique().tolist():
            self.bins[b].add(losses[seen & (bins == b)])
        far = buckets == BEYOND_REACH
        if not capture.pairs or not far.any():
            return
        self.kinds = dict(capture.kinds)
        queries = targets[far] - first  # the state at x position j predicts stream[j]
        held = before[far] + 1 - first  # x position p + 1 holds stream[p]
        predicted = before[far] - first  # x position p predicted stream[p] (-1: before the input)
        rows = torch.arange(queries.numel())
        any_hit = torch.zeros(queries.numel(), dtype=torch.bool)
        for number, pairs in capture.pairs.items():
            seen_keys = pairs[queries]  # F x L: the keys of each far token's query
            hit = seen_keys[rows, held] | ((predicted >= 0) & seen_keys[rows, predicted.clamp(min=0)])
            keys = seen_keys.sum(-1)
            chance = torch.where(
                predicted >= 0,
                random_hit_chance(keys, queries + 1, targets=2),
                random_hit_chance(keys, queries + 1, targets=1),
            )
            tally = self.hits[number]
            tally[0] += int(hit.sum())
            tally[1] += float(chance.sum())
            tally[2] += float(keys.double().sum())
            any_hit |= hit
        self.far_tokens += queries.numel()
        self.any_hits += int(any_hit.sum())

    def summary(self) -> dict:
        result = {
            "total": self.total.row(),
            "buckets": {name: self.buckets[i].row() for i, name in enumerate(BUCKETS)},
            "distance_bins": [{"from": 2**b, "to": 2 ** (b + 1), **self.bins[b].row()} for b in sorted(self.bins)],
        }
        if self.far_tokens:
            n = self.far_tokens
            result["mechanism"] = {
                "far_tokens": n,
                "any_layer_hit_share": self.any_hits / n,
                "layers": [
                    {
                        "layer": number,
                        "kind": self.kinds.get(number, ""),
                        "hit_share": hits / n,
                        "random_keys_hit_share": chance / n,
                        "mean_keys": keys / n,
                    }
                    for number, (hits, chance, keys) in sorted(self.hits.items())
                ],
            }
        return result


def print_tables(result: dict) -> None:
    total = result["total"]
    print(
        f"{result['subset']}: {total['tokens']:,} tokens, loss {total['loss_nats']:.4f} nats, reach {result['reach']}"
        f" tokens, inputs of {result['tokens_per_sample']} with {result['context_window']} of context"
    )
    print(f"{'previous occurrence':22} {'tokens':>9} {'share':>7} {'loss (nats)':>12} {'loss (base 2)':>14}")
    for name, row in result["buckets"].items():
        share = row["tokens"] / total["tokens"] if total["tokens"] else 0.0
        print(f"{name:22} {row['tokens']:>9,} {share:>7.1%} {row['loss_nats']:>12.4f} {row['loss_base2']:>14.4f}")
    mechanism = result.get("mechanism")
    if not mechanism:
        return
    print(
        f"long-range keys of the {mechanism['far_tokens']:,} 'beyond reach' tokens that include the earlier "
        f"occurrence: any layer {mechanism['any_layer_hit_share']:.1%}"
    )
    print(f"{'layer':>5} {'kind':32} {'hit':>7} {'random keys':>12} {'keys/query':>11}")
    for row in mechanism["layers"]:
        print(
            f"{row['layer']:>5} {row['kind']:32} {row['hit_share']:>7.1%} {row['random_keys_hit_share']:>12.1%}"
            f" {row['mean_keys']:>11.1f}"
        )
