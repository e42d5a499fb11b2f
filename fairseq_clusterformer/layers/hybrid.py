"""``--long-range-mode hybrid``: a long-range layer that keeps the pretrained layer's sliding-window attention and adds
its long-range attention beside it through a per-head gate that starts at zero.

Why: the paper's replacement layer (``--long-range-mode replace``, the default) attends over sorted windows only, so a
pretrained encoder's converted layer stops attending over the local windows it was trained on (what that cost in the
QA comparison: docs/qa.md). The hybrid layer computes, with the layer's own pretrained projections (no new q / k / v /
output weights),

    a_local = sliding-window attention over the windows a sliding-window layer at this position would use
    a_far   = the kind's attention over windows of the sequence sorted by group (Cluster-Former's clusters, LSH
              buckets, sparse offsets), overlapping sorted windows averaged, unsorted back to the input order
    out     = finish(x, out_proj(a_local + tanh(GATE_GAIN * g) * a_far))     (finish: residual, norm, FFN)

with ``g`` (``long_range_gate``, one value per head, broadcast over the head's channels) initialised to 0: at update
0 the layer is exactly the sliding-window layer of the same weights (``tanh(0) * a_far`` adds zeros), and
fine-tuning decides how much far context each head takes. ``tanh`` keeps a head's far share within (-1, 1) of its
local attention output; its slope at 0 gives the gate a gradient from the first step. ``GATE_GAIN`` is the gate's
learning-rate multiplier: Adam moves a parameter by about the learning rate per update whatever its gradient, so a
bare ``g`` could hardly open in a fine-tuning run of a few hundred updates at a fine-tuning learning rate; the gain
lets it (docs/qa.md works this out for the QA runs).

With ``--window-merge layer`` the local windows finish the layer per window and their outputs are averaged, as the
sliding-window layer does; ``a_far`` is a per-token value, added into every local window that holds the token. The
far branch averages the attention outputs (not the whole layer outputs, as the replacement layer does) of
overlapping sorted windows. ``--attention-backend flex`` is refused (eager attention only).

The hybrid classes subclass the replacement layers (Cluster-Former, LSH, sparse), so the K-Means refresh, its memory
bank (a forward pre-hook on every ``ClusterFormerLayer``), the centroid checks and ``qa-reach`` find them unchanged.
Bidirectional (the QA encoder) only: a causal layer refuses, and the language model refuses the flag.

B = batch, T = tokens, C = channels, K = windows, Lq / Lk = queries / keys per window.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fairseq_clusterformer.layers.baselines import LSHLayer, StridedSparseLayer
from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.compiled import compilable
from fairseq_clusterformer.layers.sorted_window import SortedWindowLayer
from fairseq_clusterformer.ops.clustering import sort_window_unsort, stable_sort
from fairseq_clusterformer.ops.masks import valid_tokens
from fairseq_clusterformer.ops.window_scheme import Windowing, WindowScheme

# the gate's learning-rate multiplier (see the module's docstring); part of what a saved gate means, so fixed
GATE_GAIN = 20.0


class HybridLongRange(SortedWindowLayer):
    """The hybrid forward for any sorted-window kind; the concrete classes below mix it into each kind."""

    hybrid = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.settings.causal:
            raise ValueError(
                "--long-range-mode hybrid is built for bidirectional layers (the QA encoder, clusterformer_qa); a "
                "causal (language model) layer runs --long-range-mode replace"
            )
        self.long_range_gate = nn.Parameter(torch.zeros(self.settings.heads))

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, local: Windowing | None = None) -> Tensor:
        """x: B x T x C; local: the sliding-window scheme of this position (the QA encoder passes its question +
        context windows), None for plain overlapping windows of the sequence."""
        out, ids = self.attend(x, padding_mask, local)
        self.observe(x, padding_mask, ids)
        return out

    def head_gates(self) -> Tensor:
        """H: each head's gate, tanh(GATE_GAIN * g): the multiple of its far attention added to its local one."""
        return torch.tanh(GATE_GAIN * self.long_range_gate)

    def far_share(self) -> Tensor:
        """C: the gate of each channel's head."""
        return self.head_gates().repeat_interleave(self.settings.embed_dim // self.settings.heads)

    @compilable
    def attend(self, x: Tensor, padding_mask: Tensor | None, local: Windowing | None = None) -> tuple[Tensor, Tensor]:
        if self.attention_backend == "flex":
            raise ValueError("--long-range-mode hybrid runs the eager attention only: use --attention-backend eager")
        s = self.settings
        bsz, length, channels = x.shape
        local = WindowScheme(s.window_size, s.window_stride, length) if local is None else local
        valid = valid_tokens(x, padding_mask)  # B x T
        ids = self.group_ids(x, padding_mask)  # B x T
        h = self.self_attn_layer_norm(x) if s.normalize_before else x
        # one projection per token serves both branches: the pretrained q, k, v
        qkv = torch.stack([self.self_attn.q_proj(h), self.self_attn.k_proj(h), self.self_attn.v_proj(h)], dim=2)

        # the local branch: exactly the attention of ``run_windows`` of a sliding-window layer
        positions = torch.arange(length, device=x.device).expand(bsz, length)  # B x T
        q, k, v = qkv.unbind(dim=2)  # B x T x C each
        near = self.window_attention(local, q, k, v, valid, positions)  # (B*K) x Lq x C

        # the far branch: windows of the sequence sorted by group, merged and unsorted to one value per token
        far_scheme = WindowScheme(s.window_size, s.window_stride, length)

        def far_windows(qkv: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
            """q, k, v (B x T x 3 x C) in sorted order -> the merged attention B x T x C in that order."""
            far = self.window_attention(far_scheme, *qkv.unbind(dim=2), valid, positions)  # (B*K') x l x C
            return far_scheme.merge(far.view(bsz, far_scheme.count, -1, channels))  # B x T x C

        _, order = stable_sort(ids)  # B x T
        far = sort_window_unsort(qkv, valid, order, far_windows) * self.far_share()  # B x T x C, input order

        if s.window_merge == "attention":
            attn = local.merge(near.view(bsz, local.count, -1, channels)) + far  # B x T x C
            return self._finish(x, self.self_attn.out_proj(attn)), ids
        attn = near + local.queries(far).flatten(0, 1)  # (B*K) x Lq x C
        y = self._finish(local.queries(x).flatten(0, 1), self.self_attn.out_proj(attn))  # (B*K) x Lq x C
        return local.merge(y.view(bsz, local.count, -1, channels)), ids  # B x T x C


class HybridClusterFormerLayer(HybridLongRange, ClusterFormerLayer):
    """Cluster-Former's sorted windows beside the sliding window; still a ``ClusterFormerLayer`` for the refresh."""


class HybridLSHLayer(HybridLongRange, LSHLayer):
    """LSH buckets' sorted windows beside the sliding window."""


class HybridSparseLayer(HybridLongRange, StridedSparseLayer):
    """The strided sparse pattern beside the sliding window."""
