"""Slow, loop-based references for the windowed layers: one token and one key set at a time.

They share nothing with the batched code in ``fairseq_clusterformer.ops`` but the layer's parameters,
so agreement means the batched windowing, sorting, masking and merging are right.
T = tokens, C = channels.
"""

import math

import torch


def token_output(layer, x, i, keys):
    """Output of ``layer`` (a WindowedTransformerLayer, eval mode) for token i of x (T x C) attending to ``keys``."""
    s = layer.settings
    attn = layer.self_attn
    h = layer.self_attn_layer_norm(x) if s.normalize_before else x
    d = s.embed_dim // s.heads
    q = attn.q_proj(h[i]).view(s.heads, d)  # H x d
    k = attn.k_proj(h[keys]).view(len(keys), s.heads, d)  # n x H x d
    v = attn.v_proj(h[keys]).view(len(keys), s.heads, d)
    weights = torch.softmax(torch.einsum("hd,nhd->hn", q, k) / math.sqrt(d), dim=-1)  # H x n
    mixed = attn.out_proj(torch.einsum("hn,nhd->hd", weights, v).reshape(-1))  # C
    y = x[i] + mixed
    if not s.normalize_before:
        y = layer.self_attn_layer_norm(y)
    return layer._feed_forward(y[None])[0]


def windows_of(length, size, stride):
    """Windows [k*m, k*m + l) clipped to the sequence, for every start below ``length``."""
    return [list(range(start, min(start + size, length))) for start in range(0, length, stride)]


def windowed_reference(layer, x, order, causal=True):
    """Windows over the tokens listed in ``order``; keys with position <= the query's; mean over windows."""
    s = layer.settings
    total = torch.zeros_like(x)
    count = torch.zeros(x.size(0), dtype=x.dtype)
    for window in windows_of(x.size(0), s.window_size, s.window_stride):
        members = [order[r] for r in window]
        for i in members:
            keys = [j for j in members if j <= i or not causal]
            total[i] += token_output(layer, x, i, keys)
            count[i] += 1
    return total / count[:, None]


def sliding_reference(layer, x, causal=True):
    """Sliding-window layer on one sequence x (T x C): mean over the windows containing each token."""
    return windowed_reference(layer, x, list(range(x.size(0))), causal)


def cluster_ids_reference(x, centroids):
    unit_x = x / x.norm(dim=-1, keepdim=True)
    unit_c = centroids / centroids.norm(dim=-1, keepdim=True)
    return [int(torch.argmax(unit_c.to(x) @ unit_x[t])) for t in range(x.size(0))]


def sorted_paper_reference(layer, x, ids, causal=True):
    """Paper mode: sort by (group, position), then the windows of the sorted list."""
    return windowed_reference(layer, x, sorted(range(x.size(0)), key=lambda t: (ids[t], t)), causal)


def band_keys(groups, i, reach):
    """Token i and its ``reach - 1`` most recent predecessors with the same group id (groups: a list of ids)."""
    same = [j for j in range(i) if groups[j] == groups[i]]
    return same[max(0, len(same) - (reach - 1)) :] + [i]


def token_output_per_head_set(layer, x, i, key_sets, next_values=False):
    """Like ``token_output``, but the heads split into len(key_sets) equal sets, set j attending to key_sets[j];
    with ``next_values`` an earlier key j gives the value of token j + 1 (token i's own key its own value)."""
    s = layer.settings
    attn = layer.self_attn
    h = layer.self_attn_layer_norm(x) if s.normalize_before else x
    d = s.embed_dim // s.heads
    per_set = s.heads // len(key_sets)
    mixed = []
    for j, keys in enumerate(key_sets):
        heads = slice(j * per_set, (j + 1) * per_set)
        q = attn.q_proj(h[i]).view(s.heads, d)[heads]  # h x d
        k = attn.k_proj(h[keys]).view(len(keys), s.heads, d)[:, heads]  # n x h x d
        values = [j + 1 if next_values and j != i else j for j in keys]
        v = attn.v_proj(h[values]).view(len(keys), s.heads, d)[:, heads]
        weights = torch.softmax(torch.einsum("hd,nhd->hn", q, k) / math.sqrt(d), dim=-1)  # h x n
        mixed.append(torch.einsum("hn,nhd->hd", weights, v).reshape(-1))
    y = x[i] + attn.out_proj(torch.cat(mixed))
    if not s.normalize_before:
        y = layer.self_attn_layer_norm(y)
    return layer._feed_forward(y[None])[0]


def sorted_strict_reference(layer, x, groupings, next_values=False):
    """Strict mode: head set j lets each token see itself and its l - 1 most recent predecessors with its group
    id in ``groupings[j]`` (a list of per-token ids; one grouping = every head)."""
    out = torch.zeros_like(x)
    for i in range(x.size(0)):
        key_sets = [band_keys(groups, i, layer.settings.window_size) for groups in groupings]
        out[i] = token_output_per_head_set(layer, x, i, key_sets, next_values)
    return out


def neighbour_groupings_reference(ids, shares, groups, groupings):
    """Group of every token in every grouping, one cluster at a time: cluster c covers [start_c, start_c + share_c)
    of [0, total); in grouping j it joins group floor((start_c + share_c / 2) / total * G + j / n)."""
    centres, start = [], 0.0
    for share in shares:
        centres.append(start + float(share) / 2)
        start += float(share)
    return [
        [min(groups, math.floor(centres[c] / start * groups + j / groupings)) for c in ids] for j in range(groupings)
    ]


def neighbour_strict_reference(layer, x, ids, next_values=False):
    """Strict mode of a cluster or LSH layer, given its per-token cluster (bucket) ids."""
    shares = layer.cluster_shares().tolist()
    groupings = neighbour_groupings_reference(ids, shares, layer.num_band_groups, layer.groupings)
    return sorted_strict_reference(layer, x, groupings, next_values)


def cluster_paper_reference(layer, x, causal=True):
    return sorted_paper_reference(layer, x, cluster_ids_reference(x, layer.centroids), causal)


def cluster_strict_reference(layer, x):
    return neighbour_strict_reference(layer, x, cluster_ids_reference(x, layer.centroids))


def lsh_ids_reference(x, rotations):
    """Reformer's hash, one token at a time: argmax over the projections on R and on -R."""
    ids = []
    for t in range(x.size(0)):
        projected = x[t].float() @ rotations.float()
        ids.append(int(torch.argmax(torch.cat([projected, -projected]))))
    return ids


def attention_merge_reference(layer, x, causal=True):
    """--window-merge attention on one sequence: per token, the mean over its windows of the attention output
    (before out_proj; it is affine, so after would be the same), then residual, norm and FFN once."""
    s = layer.settings
    attn = layer.self_attn
    h = layer.self_attn_layer_norm(x) if s.normalize_before else x
    d = s.embed_dim // s.heads
    total = torch.zeros_like(x)
    count = torch.zeros(x.size(0), dtype=x.dtype)
    for window in windows_of(x.size(0), s.window_size, s.window_stride):
        for i in window:
            keys = [j for j in window if j <= i or not causal]
            q = attn.q_proj(h[i]).view(s.heads, d)  # H x d
            k = attn.k_proj(h[keys]).view(len(keys), s.heads, d)  # n x H x d
            v = attn.v_proj(h[keys]).view(len(keys), s.heads, d)
            weights = torch.softmax(torch.einsum("hd,nhd->hn", q, k) / math.sqrt(d), dim=-1)  # H x n
            total[i] += torch.einsum("hn,nhd->hd", weights, v).reshape(-1)
            count[i] += 1
    y = x + attn.out_proj(total / count[:, None])
    if not s.normalize_before:
        y = layer.self_attn_layer_norm(y)
    return layer._feed_forward(y)
