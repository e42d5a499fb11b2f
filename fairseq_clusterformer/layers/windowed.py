"""One transformer layer (self-attention + FFN) run over a batch of windows.

B = batch, T = tokens, C = channels, K = windows, Lq / Lk = queries / keys per window.

Parameter names follow fairseq's TransformerEncoderLayer / TransformerDecoderLayer
(``self_attn.{q,k,v,out}_proj``, ``self_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``), so a
pretrained fairseq layer (RoBERTa's, a transformer_lm's) loads into a windowed one unchanged.
Layers take and return B x T x C: windows and sorting gather along T, which is simplest batch-first.
"""

from __future__ import annotations

import functools
import math

import torch
from fairseq import utils
from fairseq.modules import LayerNorm
from torch import Tensor, nn

from fairseq_clusterformer.layers.compiled import compilable
from fairseq_clusterformer.layers.flex import flex_sliding_forward
from fairseq_clusterformer.layers.settings import SLIDING_WINDOW_CHOICES, WINDOW_MERGE_CHOICES, LayerSettings
from fairseq_clusterformer.ops.attention import masked_attention, next_value_attention
from fairseq_clusterformer.ops.clustering import sort_window_unsort
from fairseq_clusterformer.ops.masks import valid_tokens
from fairseq_clusterformer.ops.step_cache import gather_rows, push_recent, push_rows, ring_filled, step_window_mask
from fairseq_clusterformer.ops.window_scheme import Windowing, WindowScheme

__all__ = [
    "SLIDING_WINDOW_CHOICES",
    "WINDOW_MERGE_CHOICES",
    "LayerSettings",
    "SlidingWindowLayer",
    "StepCache",
    "WindowedTransformerLayer",
]

# one layer's generation cache: named tensors, batch first (``ClusterFormerDecoder`` reorders them for beam search)
StepCache = dict[str, Tensor]


class SelfAttentionProjections(nn.Module):
    """The four projections of fairseq's MultiheadAttention, under the same names and initialisation."""

    def __init__(self, embed_dim: int, heads: int) -> None:
        super().__init__()
        self.num_heads = heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # fairseq scales the in-projections by 1/sqrt(2): q, k and v share one fan-in
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.constant_(self.out_proj.bias, 0.0)


class WindowedTransformerLayer(nn.Module):
    # --compile-layers and --attention-backend (``build.configure_layers`` sets them on a model's layers)
    compile_mode = "off"
    attention_backend = "eager"

    def __init__(self, settings: LayerSettings) -> None:
        super().__init__()
        self.settings = settings
        self.self_attn = SelfAttentionProjections(settings.embed_dim, settings.heads)
        self.self_attn_layer_norm = LayerNorm(settings.embed_dim)
        self.fc1 = nn.Linear(settings.embed_dim, settings.ffn_dim)
        self.fc2 = nn.Linear(settings.ffn_dim, settings.embed_dim)
        self.final_layer_norm = LayerNorm(settings.embed_dim)
        self.activation_fn = utils.get_activation_fn(settings.activation_fn)

    def run_windows(
        self, x: Tensor, scheme: Windowing, padding_mask: Tensor | None, order: Tensor | None = None
    ) -> Tensor:
        """The paper's windows: run the layer on every window of ``x`` (B x T x C) and return B x T x C in the input
        order, each token the mean of its windows' outputs (eq. 2; eq. 6-8 on a sorted sequence).

        order: B x T permutation applied before windowing (a long-range layer's sort, eq. 5), or None (a sliding
        window); padding_mask: B x T, True at pads.
        """
        bsz, _, channels = x.shape
        s = self.settings

        def windows(x: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
            """x, valid, positions (B x T) in window order -> B x T x C in that order."""
            h = self.self_attn_layer_norm(x) if s.normalize_before else x
            # the projections act on each token alone, so they run once per token, before windowing
            proj = self.self_attn
            attn = self.window_attention(scheme, proj.q_proj(h), proj.k_proj(h), proj.v_proj(h), valid, positions)
            if s.window_merge == "attention":
                # average the (pre-projection) attention outputs of overlapping windows, then finish the layer once
                # per token; out_proj is affine, so projecting after the mean equals the mean of the projections
                attn = scheme.merge(attn.view(bsz, scheme.count, -1, channels))  # B x T x C
                return self._finish(x, self.self_attn.out_proj(attn))  # B x T x C
            y = self._finish(scheme.queries(x).flatten(0, 1), self.self_attn.out_proj(attn))  # (B*K) x Lq x C
            return scheme.merge(y.view(bsz, scheme.count, -1, channels))  # B x T x C

        return sort_window_unsort(x, valid_tokens(x, padding_mask), order, windows)

    def window_attention(
        self, scheme: Windowing, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, positions: Tensor
    ) -> Tensor:
        """The attention of every window's queries, (B*K) x Lq x C, before ``out_proj``: q, k, v (B x T x C each),
        valid and positions (B x T) in window order (``sort_window_unsort``)."""
        s = self.settings
        allowed = scheme.mask(positions, valid, s.causal).flatten(0, 1)  # (B*K) x Lq x Lk
        q = scheme.queries(q).flatten(0, 1)  # (B*K) x Lq x C
        k = scheme.keys(k).flatten(0, 1)  # (B*K) x Lk x C
        v = scheme.keys(v).flatten(0, 1)  # (B*K) x Lk x C
        return masked_attention(q, k, v, allowed, s.heads, s.attention_dropout if self.training else 0.0)

    def run_band(
        self,
        x: Tensor,
        padding_mask: Tensor | None,
        orders: Tensor | None,
        sorted_groups: Tensor,
        next_values: bool = False,
    ) -> Tensor:
        """The strict band (the LM's ``--cluster-causality strict``, not the paper's windows): the heads split into n
        sets; set j attends on the sequence sorted by ``orders[j]``, each token to itself and the ``l - 1`` most
        recent earlier tokens of its group (``sorted_groups[j]``).

        x: B x T x C; orders, sorted_groups: n x B x T (group ids in sorted order, pads behind every real token).
        Every token is a query exactly once per head set, so nothing is merged: the attention outputs of the sets
        are unsorted, laid side by side as the heads they are, and the layer finishes once per token (both
        ``--window-merge`` modes compute exactly this).
        next_values: every earlier key carries the value of the token after it (``--long-range-values next``).
        orders None: one set on the unsorted sequence (``--sliding-windows band``), so nothing is gathered.
        """
        bsz, length, channels = x.shape
        s = self.settings
        sets = 1 if orders is None else orders.size(0)
        if s.heads % sets:
            raise ValueError(f"{s.heads} attention heads cannot be split into {sets} equal head sets")
        width = channels // sets
        scheme = WindowScheme(s.window_size, s.window_stride, length, band=True)
        h = self.self_attn_layer_norm(x) if s.normalize_before else x
        proj = self.self_attn
        v = proj.v_proj(h)  # B x T x C
        parts = [proj.q_proj(h), proj.k_proj(h), v]
        if next_values:
            # position t holds the value of t + 1 (zeros after the last token: only the last token's own query
            # could see that slot, and it reads its own value instead)
            parts.append(torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1))  # B x T x C
        qkv = torch.stack(parts, dim=2)  # B x T x (3 or 4) x C
        attn_dropout = s.attention_dropout if self.training else 0.0

        def band(part: Tensor, valid: Tensor, positions: Tensor, groups: Tensor) -> Tensor:
            """One head set's q, k, v (B x T x (3 or 4) x C/n) in band order -> its attention B x T x C/n."""
            allowed = scheme.mask(positions, valid, True, groups).flatten(0, 1)  # (B*K) x m x (l-1+m)
            q = scheme.queries(part[:, :, 0]).flatten(0, 1)  # (B*K) x m x C/n
            k = scheme.keys(part[:, :, 1]).flatten(0, 1)  # (B*K) x (l-1+m) x C/n
            if next_values:
                own_v = scheme.queries(part[:, :, 2]).flatten(0, 1)  # (B*K) x m x C/n
                next_v = scheme.keys(part[:, :, 3]).flatten(0, 1)  # (B*K) x (l-1+m) x C/n
                # query i of a block is key slot l - 1 + i of its key window (``band_key_windows``)
                attn = next_value_attention(
                    q, k, next_v, own_v, allowed, s.heads // sets, s.window_size - 1, attn_dropout
                )  # (B*K) x m x C/n
            else:
                v = scheme.keys(part[:, :, 2]).flatten(0, 1)  # (B*K) x (l-1+m) x C/n
                attn = masked_attention(q, k, v, allowed, s.heads // sets, attn_dropout)  # (B*K) x m x C/n
            return scheme.merge(attn.view(bsz, scheme.count, -1, width))  # B x T x C/n: the blocks end to end

        valid = valid_tokens(x, padding_mask)  # B x T
        outs = [
            # n is 1 or 2 (a constant of the layer), so this loop does not grow with T, B, P or the number of windows
            sort_window_unsort(
                qkv[..., j * width : (j + 1) * width],  # B x T x (3 or 4) x C/n
                valid,
                None if orders is None else orders[j],
                functools.partial(band, groups=sorted_groups[j]),
            )  # B x T x C/n, input order
            for j in range(sets)
        ]
        return self._finish(x, proj.out_proj(torch.cat(outs, dim=-1)))  # B x T x C

    @property
    def cacheable(self) -> bool:
        """Whether ``forward_step`` computes what ``forward`` computes: earlier outputs must not depend on later
        tokens, which a causal sliding window guarantees."""
        return self.settings.causal

    def forward_step(self, x: Tensor, cache: StepCache, position: int) -> tuple[Tensor, StepCache]:
        """The output of one appended token (x: B x 1 x C, at ``position``) from the layer's cache; returns the
        output (B x 1 x C) and the updated cache."""
        raise NotImplementedError

    def _step_projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v of new tokens (B x 1 x C each), as ``run_windows`` and ``run_band`` project them."""
        h = self.self_attn_layer_norm(x) if self.settings.normalize_before else x
        return self.self_attn.q_proj(h), self.self_attn.k_proj(h), self.self_attn.v_proj(h)

    def step_band(
        self, x: Tensor, cache: StepCache, rows: Tensor, next_values: bool = False
    ) -> tuple[Tensor, StepCache]:
        """``run_band`` for one appended token (x: B x 1 x C): head set j attends to the token itself and the
        cached keys of its group, ring buffer row ``rows[:, j]`` (B x n) of ``cache`` (``kv``: B x R x (l-1) x 2 x
        C/n keys and values, ``count``: B x R entries received); the token's key and value then enter those rows.
        With ``next_values`` a key enters its rows one step late, with the value of the token after it: the
        previous token's key (``pending_k``: B x n x C/n, for rows ``pending_rows``: B x n) goes in first."""
        bsz, _, channels = x.shape
        sets = rows.size(1)
        width = channels // sets
        q, k, v = self._step_projections(x)
        # B x 2 x C -> B x n x 2 x C/n: set j takes channels j*C/n..(j+1)*C/n of the key and of the value
        new = torch.cat([k, v], dim=1).view(bsz, 2, sets, width).transpose(1, 2)
        if next_values:
            if "pending_k" in cache:
                finished = torch.stack([cache["pending_k"], new[:, :, 1]], dim=2)  # B x n x 2 x C/n
                push_rows(cache["kv"], cache["count"], cache["pending_rows"], finished)
            cache["pending_k"], cache["pending_rows"] = new[:, :, 0], rows
        past = gather_rows(cache["kv"], rows)  # B x n x (l-1) x 2 x C/n
        both = torch.cat([past, new.unsqueeze(2)], dim=2).flatten(0, 1)  # (B*n) x l x 2 x C/n, the token last
        filled = ring_filled(gather_rows(cache["count"], rows), past.size(2))  # B x n x (l-1)
        allowed = torch.cat([filled, filled.new_ones(bsz, sets, 1)], dim=2).flatten(0, 1)  # (B*n) x l
        queries = q.view(bsz * sets, 1, width)  # (B*n) x 1 x C/n
        heads = self.settings.heads // sets
        attn = masked_attention(queries, both[:, :, 0], both[:, :, 1], allowed[:, None], heads)  # (B*n) x 1 x C/n
        out = self._finish(x, self.self_attn.out_proj(attn.view(bsz, 1, channels)))  # B x 1 x C: sets side by side
        if not next_values:
            push_rows(cache["kv"], cache["count"], rows, new)
        return out, cache

    def _finish(self, x: Tensor, attn: Tensor) -> Tensor:
        """Residual, attention norm and FFN block on any ... x C layout."""
        y = x + self._dropout(attn, self.settings.dropout)
        if not self.settings.normalize_before:
            y = self.self_attn_layer_norm(y)
        return self._feed_forward(y)

    def _feed_forward(self, y: Tensor) -> Tensor:
        s = self.settings
        h = self.final_layer_norm(y) if s.normalize_before else y
        h = self._dropout(self._activation(self.fc1(h)), s.activation_dropout)
        y = y + self._dropout(self.fc2(h), s.dropout)
        return y if s.normalize_before else self.final_layer_norm(y)

    def _activation(self, h: Tensor) -> Tensor:
        # fairseq's gelu computes gelu(h.float()).type_as(h): on bfloat16 states under autocast that is two copies of
        # the B x T x F hidden states a layer (and their backward); torch's gelu takes bfloat16 as it is, computing
        # in float32 inside its kernel, with the same bfloat16 result
        if h.dtype == torch.bfloat16 and self.settings.activation_fn == "gelu":
            return nn.functional.gelu(h)
        return self.activation_fn(h)

    def _dropout(self, x: Tensor, p: float) -> Tensor:
        return nn.functional.dropout(x, p=p, training=self.training) if p > 0 else x


class SlidingWindowLayer(WindowedTransformerLayer):
    """Paper section 3.1: a transformer layer on overlapping windows, overlaps averaged; or, with
    ``--sliding-windows band``, on the band of every token's ``l - 1`` predecessors (nothing to average)."""

    @compilable
    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        if self.attention_backend == "flex":
            return flex_sliding_forward(self, x, padding_mask)
        if self.settings.sliding_windows == "band":
            # the band of the unsorted sequence, every token in group 0: no sort, no gather
            groups = torch.zeros(1, *x.shape[:2], dtype=torch.long, device=x.device)  # 1 x B x T
            return self.run_band(x, padding_mask, None, groups)
        scheme = WindowScheme(self.settings.window_size, self.settings.window_stride, x.size(1))
        return self.run_windows(x, scheme, padding_mask)

    def forward_step(self, x: Tensor, cache: StepCache, position: int) -> tuple[Tensor, StepCache]:
        """One appended token (x: B x 1 x C) from the cached keys and values of the ``l - 1`` positions before it
        (``k``, ``v``: B x L x C, L <= l - 1): overlap, every window that contains it attends from its start to
        the token; band, the token attends to all of them."""
        s = self.settings
        q, k, v = self._step_projections(x)
        keys = push_recent(cache.get("k"), k, s.window_size)  # B x L+1 x C, the new token last
        values = push_recent(cache.get("v"), v, s.window_size)  # B x L+1 x C
        new_cache = {"k": keys[:, 1 - s.window_size :], "v": values[:, 1 - s.window_size :]}
        if s.sliding_windows == "band":
            allowed = keys.new_ones(x.size(0), 1, keys.size(1), dtype=torch.bool)  # B x 1 x (L+1)
            return self._finish(
                x, self.self_attn.out_proj(masked_attention(q, keys, values, allowed, s.heads))
            ), new_cache
        allowed = step_window_mask(position, keys.size(1), s.window_size, s.window_stride, x.device)  # W x (L+1)
        count = allowed.size(0)
        # the query once per window: W "queries" that differ only in their masks
        attn = masked_attention(q.expand(-1, count, -1), keys, values, allowed.expand(x.size(0), -1, -1), s.heads)
        if s.window_merge == "attention":
            out = self._finish(x, self.self_attn.out_proj(attn.mean(dim=1, keepdim=True)))  # B x 1 x C
        else:
            out = self._finish(x.expand(-1, count, -1), self.self_attn.out_proj(attn)).mean(dim=1, keepdim=True)
        return out, new_cache
