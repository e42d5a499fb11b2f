"""The layers' windowed attention as FlexAttention (torch's ``flex_attention``), ``--attention-backend flex``.

B = batch, T = tokens, C = channels, H = heads, d = C / H, n = head sets (strict groupings), r = window copies
(windows that hold a token at most, ceil(l / m)), l = window size, m = stride, Tp = T rounded up to the block size.

Every form is one ``flex_attention`` call on the (sorted) sequence, whose ``mask_mod`` reads captured tensors:
- band (strict causality, ``--sliding-windows band``): query rank t sees key ranks (t - l, t] of its own group, in
  the order of its head set (each head set gathers q, k, v in its own sorted order, so one call serves every set);
- overlapping windows (the paper's sliding window and paper-mode sorted windows): every token is a query once per
  window that holds it, as r copies of the queries (Q_LEN = r * Tp); copy c of rank t sits in window t // m - c and
  sees the keys of that window that are earlier in the original order; the layer averages the copies;
- next values (``--long-range-values next``): the band without the query's own key, over the next values, merged
  with the own key's score and value through the call's log-sum-exp.

The block structure (which key blocks each query block may touch) depends on T, l and m alone: it is built once per
shape and kept; only the ``mask_mod``'s captured tensors (orders, groups, padding) change from call to call.
"""

from __future__ import annotations

import importlib.util
import math

import torch
from torch import Tensor

from fairseq_clusterformer.ops.clustering import inverse_permutation, permute_tokens
from fairseq_clusterformer.ops.tracing import is_compiling

BLOCK = 128  # FlexAttention's default sparse block: the GPU kernels' tile
_STRUCTURES: dict[tuple, tuple[Tensor, Tensor, Tensor, Tensor]] = {}
_COMPILED_FLEX: list = []


def flex_unavailable() -> str:
    """'' when this torch has FlexAttention, else why not."""
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention (torch >= 2.5 has)"
    return ""


def _ordered(dense: Tensor) -> tuple[Tensor, Tensor]:
    """Rows x cols boolean -> (1 x 1 x rows count, 1 x 1 x rows x cols column indices, the True ones first)."""
    counts = dense.sum(-1, dtype=torch.int32)  # rows
    indices = torch.argsort((~dense).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # rows x cols
    return counts[None, None], indices[None, None]


def _structure(lo: Tensor, hi: Tensor, kv_len: int, block: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """KV and Q block lists of a mask whose query block i only touches keys [lo_i, hi_i) (lo, hi: query blocks)."""
    kv_blocks = -(-kv_len // block)
    starts = torch.arange(kv_blocks, device=lo.device) * block  # KVb
    dense = (starts[None, :] < hi[:, None]) & (starts[None, :] + block > lo[:, None]) & (hi > lo)[:, None]  # Qb x KVb
    return (*_ordered(dense), *_ordered(dense.t()))


def band_structure(length: int, reach: int, block: int, device: torch.device) -> tuple[Tensor, ...]:
    """Query rank t sees key ranks (t - reach, t]."""
    first = torch.arange(-(-length // block), device=device) * block  # Qb, first query of each block
    return _structure((first - reach + 1).clamp(min=0), (first + block).clamp(max=length), length, block)


def window_structure(length: int, size: int, stride: int, copies: int, block: int, device) -> tuple[Tensor, ...]:
    """Copy c of query rank t sees the window starting at (t // stride - c) * stride (Q_LEN = copies * Tp)."""
    padded = -(-length // block) * block
    first = torch.arange(copies * padded // block, device=device) * block  # Qb
    copy, t = first // padded, first % padded
    lo = (t // stride - copy).clamp(min=0) * stride  # the first block's window (later ones start no earlier)
    last = (t + block - 1).clamp(max=length - 1)  # the last real query of the block
    hi = ((last // stride - copy) * stride + size).clamp(max=length)
    hi = torch.where(last // stride - copy >= 0, hi, lo)  # a block of missing windows touches nothing
    return _structure(lo, hi, length, block)


def block_mask(kind: str, mask_mod, q_len: int, kv_len: int, device: torch.device, *params: int):
    """A ``BlockMask`` with the cached structure of ``kind`` ("band" or "window", with ``params``) and ``mask_mod``.

    The structure is kept per shape in eager mode; inside a compiled region it is a few index ops of the graph."""
    from torch.nn.attention.flex_attention import BlockMask

    key = (kind, q_len, kv_len, str(device), *params)
    build = band_structure if kind == "band" else window_structure
    if is_compiling():
        parts = build(kv_len, *params, BLOCK, device)
    else:
        if key not in _STRUCTURES:
            _STRUCTURES[key] = build(kv_len, *params, BLOCK, device)
        parts = _STRUCTURES[key]
    kv_num, kv_index, q_num, q_index = parts
    return BlockMask(
        seq_lengths=(q_len, kv_len),
        kv_num_blocks=kv_num,
        kv_indices=kv_index,
        full_kv_num_blocks=None,
        full_kv_indices=None,
        q_num_blocks=q_num,
        q_indices=q_index,
        full_q_num_blocks=None,
        full_q_indices=None,
        BLOCK_SIZE=(BLOCK, BLOCK),
        mask_mod=mask_mod,
    )


def flex(q: Tensor, k: Tensor, v: Tensor, mask, lse: bool = False):
    """``flex_attention`` (B x H x L x d each); on a GPU outside a compiled region through its compiled kernel (the
    eager one is a slow reference), on a CPU the eager one (torch's CPU kernel has no backward pass)."""
    from torch.nn.attention import flex_attention as module

    run = module.flex_attention
    if q.is_cuda and not is_compiling():
        if not _COMPILED_FLEX:
            _COMPILED_FLEX.append(torch.compile(module.flex_attention))
        run = _COMPILED_FLEX[0]
    if not lse:
        return run(q, k, v, block_mask=mask)
    if hasattr(module, "AuxRequest"):  # torch >= 2.9; ``return_lse`` is deprecated there
        out, aux = run(q, k, v, block_mask=mask, return_aux=module.AuxRequest(lse=True))
        return out, aux.lse
    return run(q, k, v, block_mask=mask, return_lse=True)


def heads_first(x: Tensor, heads: int) -> Tensor:
    """B x L x C -> B x H x L x d."""
    bsz, length, channels = x.shape
    return x.view(bsz, length, heads, channels // heads).transpose(1, 2)


def heads_last(x: Tensor) -> Tensor:
    """B x H x L x d -> B x L x C."""
    bsz, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(bsz, length, heads * dim)


def band_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    heads: int,
    reach: int,
    valid: Tensor,
    orders: Tensor | None,
    groups: Tensor | None,
    next_v: Tensor | None = None,
) -> Tensor:
    """Strict-causality attention in the input order: head set j sees, on the sequence sorted by ``orders[j]``, each
    token itself and its ``reach - 1`` most recent predecessors of its group (``groups[j]``, in sorted order).

    q, k, v, next_v: B x T x C; valid: B x T (False at pads); orders, groups: n x B x T, or None for one set on the
    unsorted sequence with every token in one group (``--sliding-windows band``). With ``next_v`` every key but the
    query's own carries ``next_v`` (``ops.attention.next_value_attention``). Returns B x T x C.
    """
    bsz, length, channels = q.shape
    sets = 1 if orders is None else orders.size(0)
    per_set = heads // sets
    parts = [heads_first(t, heads) for t in (q, k, v)] + ([] if next_v is None else [heads_first(next_v, heads)])
    if orders is None:
        sorted_valid = valid[:, None]  # B x 1 x T
        same_group = None
    else:
        index = orders.permute(1, 0, 2).repeat_interleave(per_set, dim=1)  # B x H x T: each head's set order
        inverse = inverse_permutation(index)  # B x H x T
        parts = [permute_tokens(t, index, inverse) for t in parts]  # sorted per head set
        sorted_valid = torch.gather(valid[None].expand(sets, -1, -1), 2, orders).transpose(0, 1)  # B x n x T
        same_group = groups.transpose(0, 1).contiguous()  # B x n x T, sorted order
    sorted_valid = sorted_valid.contiguous()
    exclude_self = next_v is not None

    def allowed(b, h, qi, ki):
        keep = (ki <= qi) & (qi - ki < reach) & sorted_valid[b, h // per_set, ki]
        if same_group is not None:
            keep = keep & (same_group[b, h // per_set, qi] == same_group[b, h // per_set, ki])
        return keep & (ki != qi) if exclude_self else keep | (ki == qi)

    mask = block_mask("band", allowed, length, length, q.device, reach)
    if next_v is None:
        out = flex(parts[0], parts[1], parts[2], mask)  # B x H x T x d, sorted
    else:
        qs, ks, own_v, nv = parts
        mixed, lse = flex(qs, ks, nv, mask, lse=True)  # B x H x T x d, B x H x T: every key but the own
        acc = torch.promote_types(q.dtype, torch.float32)  # half-precision scores are merged in float32
        own = (qs.to(acc) * ks.to(acc)).sum(-1) / math.sqrt(qs.size(-1))  # B x H x T, the own key's score
        lse = lse.to(acc)
        top = torch.maximum(lse, own)  # lse is -inf where no other key is allowed
        w_mixed, w_own = torch.exp(lse - top), torch.exp(own - top)  # B x H x T each
        out = (mixed.to(acc) * w_mixed[..., None] + own_v.to(acc) * w_own[..., None]) / (w_mixed + w_own)[..., None]
        out = out.to(q.dtype)
    if orders is not None:
        out = permute_tokens(out, inverse, index)  # back in the input order
    return heads_last(out)


def window_copies(length: int, size: int, stride: int) -> int:
    """r: the most windows [k*m, k*m + l) that hold one position."""
    return -(-size // stride)


def copy_weights(length: int, size: int, stride: int, device, dtype) -> Tensor:
    """r x T: 1 / coverage where copy c of position t is a real window (t // m - c >= 0 and holds t), else 0."""
    t = torch.arange(length, device=device)
    window = t[None, :] // stride - torch.arange(window_copies(length, size, stride), device=device)[:, None]  # r x T
    real = (window >= 0) & (window * stride + size > t[None, :])  # r x T
    return real.to(dtype) / real.sum(0, keepdim=True).to(dtype)


def window_attention(
    q: Tensor, k: Tensor, v: Tensor, heads: int, size: int, stride: int, positions: Tensor, valid: Tensor, causal: bool
) -> Tensor:
    """The paper's overlapping windows [k*m, k*m + l) of a (sorted) sequence, every copy of every query at once.

    q, k, v: B x T x C in window order; positions: B x T original positions (unique), valid: B x T (False at pads);
    causal: a key must not come after the query in the original order. Returns B x r x T x C: copy c of token t
    attended within window t // m - c (rows of copies that do not exist are junk; ``copy_weights`` zeroes them).
    """
    bsz, length, channels = q.shape
    copies = window_copies(length, size, stride)
    padded = -(-length // BLOCK) * BLOCK
    qh = heads_first(q, heads)  # B x H x T x d
    qh = torch.nn.functional.pad(qh, (0, 0, 0, padded - length)).repeat(1, 1, copies, 1)  # B x H x r*Tp x d
    pos = torch.nn.functional.pad(positions, (0, padded - length), value=-1)  # B x Tp: pads later than nothing
    ok = torch.nn.functional.pad(valid, (0, padded - length)).contiguous()  # B x Tp

    def allowed(b, h, qi, ki):
        t = qi % padded
        start = (t // stride - qi // padded) * stride
        keep = ok[b, ki] & (pos[b, ki] <= pos[b, t]) if causal else ok[b, ki]
        return (start >= 0) & (ki >= start) & (ki < start + size) & (keep | (ki == t))

    mask = block_mask("window", allowed, copies * padded, length, q.device, size, stride, copies)
    out = flex(qh, heads_first(k, heads), heads_first(v, heads), mask)  # B x H x r*Tp x d
    return heads_last(out).view(bsz, copies, padded, channels)[:, :, :length]  # B x r x T x C
