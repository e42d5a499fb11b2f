"""Bookkeeping of the long-range breakdown: losses per distance bucket, and which keys the long-range layers gave.

L = tokens of one input, R = scored tokens of one block, N = tokens of the split.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fairseq_clusterformer.layers.sorted_window import SortedWindowLayer
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
    layer number (1-based) to the L x L states whose values each query of the input may read (any head): its keys,
    or with ``--long-range-values next`` the token after each earlier key, and itself."""

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
            if layer.values == "next":
                pairs = stats.next_value_reads(pairs)
            self.pairs[number] = pairs[0].cpu()

        return record

    def clear(self) -> None:
        self.pairs.clear()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def row(tokens: int, loss: float) -> dict:
    """One table row from a token count and its summed loss (nats)."""
    mean = loss / tokens if tokens else float("nan")
    return {"tokens": tokens, "loss_nats": mean, "loss_base2": mean / math.log(2)}


# the recall task's positions (--recall-facts): a recalled answer can only be predicted from its first occurrence,
# the first occurrence itself from nothing (the control: chance for every model)
ROLES = ("other", "recalled", "first occurrence")
BINS = 64  # log2 distance bins: int64 distances stay below 2^63


class Tally:
    """Token counts and summed losses per distance bucket and log2 distance bin, and the mechanism counts per
    long-range layer, accumulated block by block."""

    def __init__(self, stream: Tensor, documents: Tensor, reach: int, roles: Tensor | None = None) -> None:
        self.previous = previous_occurrence(stream, documents)  # N
        self.reach = reach
        self.roles = roles  # N: ROLES index of each stream position (the recall task's answers), or None
        self.role_tokens = torch.zeros(len(ROLES), dtype=torch.long)
        self.role_loss = torch.zeros(len(ROLES), dtype=torch.float64)
        self.bucket_tokens = torch.zeros(len(BUCKETS), dtype=torch.long)
        self.bucket_loss = torch.zeros(len(BUCKETS), dtype=torch.float64)
        self.bin_tokens = torch.zeros(BINS, dtype=torch.long)
        self.bin_loss = torch.zeros(BINS, dtype=torch.float64)
        # layer -> summed over far tokens (float64): hits, their random-key chance, keys, and the same two for the
        # state holding the earlier occurrence alone (a causal copy needs that one: the state that predicted the
        # earlier occurrence had not seen it)
        self.hits: dict[int, Tensor] = {}
        self.far_tokens = 0
        self.any_hits = 0
        self.any_held = 0
        self.recalled_far = 0  # recalled values in the beyond-reach bucket, and those whose answer state is a key
        self.recalled_held = 0
        self.kinds: dict[int, str] = {}

    def add(self, targets: Tensor, scores: Tensor, input_start: int, capture: LayerCapture, first: int) -> None:
        """targets: R stream positions; scores: R log-probs; input_start: first stream position the input showed;
        first: the input's first x position (x = [eos] + stream), which maps stream positions to query rows."""
        losses = -scores.double()
        buckets = distance_buckets(targets, self.previous, torch.full_like(targets, input_start), self.reach)  # R
        self.bucket_tokens += torch.bincount(buckets, minlength=len(BUCKETS))
        self.bucket_loss += torch.bincount(buckets, weights=losses, minlength=len(BUCKETS))
        if self.roles is not None:
            roles = self.roles[targets]  # R
            self.role_tokens += torch.bincount(roles, minlength=len(ROLES))
            self.role_loss += torch.bincount(roles, weights=losses, minlength=len(ROLES))
        before = self.previous[targets]
        seen = before >= input_start  # the earlier occurrence is in the input
        bins = log2_bins(targets[seen] - before[seen])
        self.bin_tokens += torch.bincount(bins, minlength=BINS)
        self.bin_loss += torch.bincount(bins, weights=losses[seen], minlength=BINS)
        far = buckets == BEYOND_REACH
        if not capture.pairs or not far.any():
            return
        self.kinds = dict(capture.kinds)
        queries = targets[far] - first  # the state at x position j predicts stream[j]
        held = before[far] + 1 - first  # x position p + 1 holds stream[p]
        predicted = before[far] - first  # x position p predicted stream[p] (-1: before the input)
        rows = torch.arange(queries.numel())
        any_hit = torch.zeros(queries.numel(), dtype=torch.bool)
        any_held = torch.zeros(queries.numel(), dtype=torch.bool)
        for number, pairs in capture.pairs.items():  # one entry per long-range layer
            seen_keys = pairs[queries]  # F x L: the keys of each far token's query
            held_hit = seen_keys[rows, held]
            hit = held_hit | ((predicted >= 0) & seen_keys[rows, predicted.clamp(min=0)])
            keys = seen_keys.sum(-1)
            chance = random_hit_chance(keys, queries + 1, targets=1 + (predicted >= 0).long())
            held_chance = random_hit_chance(keys, queries + 1, targets=1)
            counts = [hit.double().sum(), chance.sum(), keys.double().sum(), held_hit.double().sum(), held_chance.sum()]
            self.hits[number] = self.hits.get(number, torch.zeros(5, dtype=torch.float64)) + torch.stack(counts)
            any_hit |= hit
            any_held |= held_hit
        self.far_tokens += queries.numel()
        self.any_hits += int(any_hit.sum())
        self.any_held += int(any_held.sum())
        if self.roles is not None:
            recalled = self.roles[targets[far]] == ROLES.index("recalled")  # F
            self.recalled_far += int(recalled.sum())
            self.recalled_held += int((recalled & any_held).sum())

    def summary(self) -> dict:
        tokens, loss = self.bucket_tokens.tolist(), self.bucket_loss.tolist()
        result = {
            "total": row(sum(tokens), sum(loss)),
            "buckets": {name: row(tokens[i], loss[i]) for i, name in enumerate(BUCKETS)},
            "distance_bins": [
                {"from": 2**b, "to": 2 ** (b + 1), **row(int(self.bin_tokens[b]), float(self.bin_loss[b]))}
                for b in torch.nonzero(self.bin_tokens).flatten().tolist()
            ],
        }
        if self.roles is not None:
            tokens, loss = self.role_tokens.tolist(), self.role_loss.tolist()
            result["recall_task"] = {name: row(tokens[i], loss[i]) for i, name in enumerate(ROLES) if i}
        if self.far_tokens:
            n = self.far_tokens
            result["mechanism"] = {
                "far_tokens": n,
                "any_layer_hit_share": self.any_hits / n,
                "any_layer_held_share": self.any_held / n,
                "layers": [
                    {
                        "layer": number,
                        "kind": self.kinds.get(number, ""),
                        "hit_share": float(counts[0]) / n,
                        "random_keys_hit_share": float(counts[1]) / n,
                        "held_share": float(counts[3]) / n,
                        "random_keys_held_share": float(counts[4]) / n,
                        "mean_keys": float(counts[2]) / n,
                    }
                    for number, counts in sorted(self.hits.items())
                ],
            }
            if self.recalled_far:
                result["mechanism"]["recalled_far"] = self.recalled_far
                result["mechanism"]["recalled_held_share"] = self.recalled_held / self.recalled_far
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
    for name, row in result.get("recall_task", {}).items():
        print(f"{'recall task: ' + name:30} {row['tokens']:>9,} {row['loss_nats']:>12.4f} {row['loss_base2']:>14.4f}")
    mechanism = result.get("mechanism")
    if not mechanism:
        return
    print(
        f"long-range keys of the {mechanism['far_tokens']:,} 'beyond reach' tokens that include the earlier "
        f"occurrence (the state holding it, or the state that predicted it): any layer "
        f"{mechanism['any_layer_hit_share']:.1%}; the state holding it: {mechanism['any_layer_held_share']:.1%}"
    )
    if "recalled_far" in mechanism:
        print(
            f"recall task: {mechanism['recalled_held_share']:.1%} of the {mechanism['recalled_far']:,} recalled values"
            " have the state holding their first occurrence among their long-range keys"
        )
    print(f"{'layer':>5} {'kind':32} {'hit':>7} {'random keys':>12} {'holding':>8} {'random':>7} {'keys/query':>11}")
    for row in mechanism["layers"]:
        print(
            f"{row['layer']:>5} {row['kind']:32} {row['hit_share']:>7.1%} {row['random_keys_hit_share']:>12.1%}"
            f" {row['held_share']:>8.1%} {row['random_keys_held_share']:>7.1%} {row['mean_keys']:>11.1f}"
        )
