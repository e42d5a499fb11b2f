"""QA windows (question + context) and answer spans in ops/: against loop references."""

import itertools

import pytest
import torch

from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from fairseq_clusterformer.qa.ops.spans import best_spans, candidate_log_softmax, gold_span_log_likelihood, top_spans
from fairseq_clusterformer.qa.ops.windows import (
    QAInputWindows,
    QALayout,
    QAWindows,
    from_flat,
    gather_windows,
    merge_windows,
    qa_tokens,
    to_flat,
)
from tests.reference import token_output

LAYOUTS = [(3, 1, 4, 2), (4, 7, 4, 3), (2, 9, 5, 2), (5, 16, 8, 5), (3, 12, 6, 4)]  # Q, T, l, m


def labelled(layout, bsz=2):
    """Question copy k, slot j holds -(1000 k + j + 1); context position c holds c; both per batch row + 10^5 b."""
    k, q = layout.count, layout.question_len
    rows = torch.arange(bsz)[:, None] * 100_000
    question = -(1000 * torch.arange(k)[:, None] + torch.arange(q)[None, :] + 1)  # K x Q
    question = question[None].expand(bsz, -1, -1) - rows[:, :, None]  # B x K x Q
    context = torch.arange(layout.context_len)[None, :] + rows  # B x T
    return question, context


def window_reference(question, context, layout, b, k, fill):
    """Window k of row b, written out: its question copy, then context[k*m : k*m + l] with ``fill`` past T."""
    items = question[b, k].tolist()
    for i in range(layout.size):
        c = k * layout.stride + i
        items.append(int(context[b, c]) if c < layout.context_len else fill)
    return items


@pytest.mark.parametrize("q,t,size,stride", LAYOUTS)
def test_windows_are_question_copy_plus_context_slice(q, t, size, stride):
    layout = QALayout(q, t, size, stride)
    question, context = labelled(layout)
    windows = gather_windows(to_flat(question, context, layout, fill=7), layout, fill=7)  # B x K x W
    assert windows.shape == (2, layout.count, q + size)
    for b, k in itertools.product(range(2), range(layout.count)):
        assert windows[b, k].tolist() == window_reference(question, context, layout, b, k, 7)


@pytest.mark.parametrize("q,t,size,stride", LAYOUTS)
def test_flat_layout_is_eq4_and_round_trips(q, t, size, stride):
    layout = QALayout(q, t, size, stride)
    question, context = labelled(layout)
    flat = to_flat(question, context, layout, fill=7)
    # eq. 3: [question copy k; context[k*m : (k+1)*m]] for k = 0..K-1
    expected = []
    for k in range(layout.count):
        expected += question[0, k].tolist()
        expected += [int(context[0, c]) if c < t else 7 for c in range(k * stride, (k + 1) * stride)]
    assert flat[0].tolist() == expected
    back_q, back_c = from_flat(flat, layout)
    assert torch.equal(back_q, question) and torch.equal(back_c, context)
    assert flat[0, layout.context_slots()].tolist() == context[0].tolist()


@pytest.mark.parametrize("q,t,size,stride", LAYOUTS)
def test_merge_keeps_question_copies_and_averages_context(q, t, size, stride):
    layout = QALayout(q, t, size, stride)
    gen = torch.Generator().manual_seed(0)
    windows = torch.randn(2, layout.count, q + size, 3, generator=gen, dtype=torch.float64)
    question, context = from_flat(merge_windows(windows, layout), layout)
    assert torch.equal(question, windows[:, :, :q])
    for c in range(t):
        holders = [(k, c - k * stride) for k in range(layout.count) if 0 <= c - k * stride < size]
        mean = torch.stack([windows[:, k, q + i] for k, i in holders]).mean(dim=0)
        assert torch.allclose(context[:, c], mean, atol=1e-12)
    # merging the windows of a flat sequence gives it back
    flat = torch.randn(2, layout.flat_len, 3, generator=gen, dtype=torch.float64)
    assert torch.allclose(merge_windows(gather_windows(flat, layout), layout), flat, atol=1e-12)


def test_tokens_of_a_window_and_padding_of_foreign_windows():
    bos, eos, pad = 0, 2, 1
    question = torch.tensor([[10, 11, 12], [20, pad, pad]])
    context = torch.tensor([[30 + i for i in range(9)], [40, 41, 42, pad, pad, pad, pad, pad, pad]])
    layout = QALayout(question.size(1) + 3, context.size(1), 4, 3)
    flat, windows = qa_tokens(question, context, layout, bos, eos, pad)
    assert layout.count == 3
    ctx = context.tolist()
    for k in range(3):
        tail = [ctx[0][c] if c < 9 else pad for c in range(3 * k, 3 * k + 4)]
        assert windows[0, k].tolist() == [bos, 10, 11, 12, eos, eos] + tail  # RoBERTa's pair separator </s></s>
    # row 1 has 3 context tokens: one window of its own; its later windows are all pad
    assert windows[1, 0].tolist() == [bos, 20, eos, eos, pad, pad, 40, 41, 42, pad]
    assert windows[1, 1:].eq(pad).all()
    assert flat.shape == (2, layout.flat_len)
    assert from_flat(flat, layout)[1].tolist() == ctx


def attention_output(layer, x, i, keys):
    """Multi-head attention of token i of x (T x C) over ``keys``, before out_proj (post-norm layer)."""
    s, attn = layer.settings, layer.self_attn
    d = s.embed_dim // s.heads
    q = attn.q_proj(x[i]).view(s.heads, d)  # H x d
    k = attn.k_proj(x[keys]).view(len(keys), s.heads, d)  # n x H x d
    v = attn.v_proj(x[keys]).view(len(keys), s.heads, d)
    weights = torch.softmax(torch.einsum("hd,nhd->hn", q, k) / d**0.5, dim=-1)  # H x n
    return torch.einsum("hn,nhd->hd", weights, v).reshape(-1)


def qa_window_reference(layer, flat, valid, layout, merge):
    """One row: run every window token by token over the window's valid slots; question copies keep their own
    output, context slots the mean over windows (of the layer output, or of the attention output for
    --window-merge attention). Returns {slot: output} for the valid slots."""
    slots = layout.window_slots()
    total, count = {}, {}
    for k in range(layout.count):
        members = [int(s) for s in slots[k] if s < layout.flat_len]
        keys = [s for s in members if valid[s]]
        for i in keys:
            out = token_output(layer, flat, i, keys) if merge == "layer" else attention_output(layer, flat, i, keys)
            total[i] = total.get(i, 0) + out
            count[i] = count.get(i, 0) + 1
    if merge == "layer":
        return {i: total[i] / count[i] for i in total}
    out = {}
    for i in total:
        y = layer.self_attn_layer_norm(flat[i] + layer.self_attn.out_proj(total[i] / count[i]))
        out[i] = layer._feed_forward(y[None])[0]
    return out


@pytest.mark.parametrize("q,t,size,stride", [(4, 7, 4, 3), (3, 12, 6, 4), (5, 16, 8, 5)])
@pytest.mark.parametrize("merge", ["layer", "attention"])
def test_qa_sliding_window_layer_matches_loop_reference(q, t, size, stride, merge):
    torch.manual_seed(0)
    settings = LayerSettings(16, 32, 2, size, stride, causal=False, normalize_before=False, window_merge=merge)
    layer = SlidingWindowLayer(settings).double().eval()
    layout = QALayout(q, t, size, stride)
    flat = torch.randn(2, layout.flat_len, 16, dtype=torch.float64)
    pad = torch.rand(2, layout.flat_len, generator=torch.Generator().manual_seed(1)) < 0.2
    out = layer.run_windows(flat, QAWindows(layout), pad)
    for b in range(2):
        reference = qa_window_reference(layer, flat[b], ~pad[b], layout, merge)
        assert len(reference) == int((~pad[b]).sum())
        for i, expected in reference.items():
            assert torch.allclose(out[b, i], expected, atol=1e-10), (b, i)


def test_first_layer_windows_equal_running_each_window_alone():
    """QAInputWindows: every window is one sequence; its outputs merge into the flat layout."""
    torch.manual_seed(0)
    layout = QALayout(3, 10, 4, 3)
    layer = SlidingWindowLayer(LayerSettings(16, 32, 2, 4, 3, causal=False)).double().eval()
    windows = torch.randn(2, layout.count, layout.window_len, 16, dtype=torch.float64)
    pad = torch.zeros(2, layout.count, layout.window_len, dtype=torch.bool)
    pad[1, :, 2] = True
    out = layer.run_windows(windows.flatten(1, 2), QAInputWindows(layout), pad.flatten(1))
    each = torch.zeros_like(windows)
    for b, k in itertools.product(range(2), range(layout.count)):
        keys = [j for j in range(layout.window_len) if not pad[b, k, j]]
        for i in range(layout.window_len):
            each[b, k, i] = token_output(layer, windows[b, k], i, keys if i in keys else keys + [i])
    assert torch.allclose(out, merge_windows(each, layout), atol=1e-10)


def span_loglik_reference(start, end, valid, spans):
    log_s = torch.log_softmax(start.masked_fill(~valid, float("-inf")), -1)
    log_e = torch.log_softmax(end.masked_fill(~valid, float("-inf")), -1)
    probs = [torch.exp(log_s[s] + log_e[e]) for s, e in spans if s >= 0]
    return torch.log(sum(probs)) if probs else None


def test_gold_span_likelihood_sums_over_every_occurrence():
    gen = torch.Generator().manual_seed(3)
    start, end = torch.randn(3, 9, generator=gen, dtype=torch.float64), torch.randn(3, 9, generator=gen).double()
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[1, 0] = False
    spans = torch.tensor([[[1, 2], [4, 4], [6, 8]], [[2, 3], [-1, -1], [-1, -1]], [[-1, -1], [-1, -1], [-1, -1]]])
    ll, has_gold = gold_span_log_likelihood(start, end, valid, spans)
    assert has_gold.tolist() == [True, True, False]
    for b in range(2):
        assert torch.allclose(ll[b], span_loglik_reference(start[b], end[b], valid[b], spans[b].tolist()))
    assert ll[2] == 0
    # one occurrence: the usual start/end cross-entropy
    single = torch.tensor([[[4, 4]], [[2, 3]], [[0, 1]]])
    one, _ = gold_span_log_likelihood(start, end, torch.ones_like(valid), single)
    ce = torch.log_softmax(start, -1)[0, 4] + torch.log_softmax(end, -1)[0, 4]
    assert torch.allclose(one[0], ce)


def test_gold_span_likelihood_gradient_is_finite_with_masked_positions():
    start = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    end = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    valid = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    spans = torch.tensor([[[0, 1], [-1, -1]], [[-1, -1], [-1, -1]]])
    ll, _ = gold_span_log_likelihood(start, end, valid, spans)
    ll.sum().backward()
    assert torch.isfinite(start.grad).all() and torch.isfinite(end.grad).all()
    assert torch.autograd.gradcheck(
        lambda s, e: gold_span_log_likelihood(s, e, valid, spans)[0],
        (start.detach().requires_grad_(), end.detach().requires_grad_()),
    )


@pytest.mark.parametrize("seed", range(5))
def test_best_span_equals_exhaustive_search(seed):
    gen = torch.Generator().manual_seed(seed)
    start, end = torch.randn(4, 11, generator=gen), torch.randn(4, 11, generator=gen)
    valid = torch.rand(4, 11, generator=gen) > 0.3
    valid[:, 0] = True
    for max_len in (1, 3, 20):
        starts, ends, scores = best_spans(start, end, valid, max_len)
        for b in range(4):
            best = max(
                (float(start[b, s] + end[b, e]), s, e)
                for s in range(11)
                for e in range(s, min(11, s + max_len))
                if valid[b, s] and valid[b, e]
            )
            assert (float(scores[b]), int(starts[b]), int(ends[b])) == pytest.approx(best)


@pytest.mark.parametrize("seed", range(3))
def test_top_spans_equal_exhaustive_search_within_paragraphs(seed):
    """The k best spans (the hub's top_k) are the k best of every allowed span, best first, never across a segment;
    a row with fewer allowed spans than k is padded with -inf."""
    gen = torch.Generator().manual_seed(seed)
    start, end = torch.randn(3, 9, generator=gen), torch.randn(3, 9, generator=gen)
    valid = torch.rand(3, 9, generator=gen) > 0.3
    valid[2] = False
    valid[2, 4] = True  # one allowed span only
    segments = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2]).expand(3, 9)
    starts, ends, scores = top_spans(start, end, valid, 4, 6, segments)
    for b in range(3):
        every = sorted(
            ((float(start[b, s] + end[b, e]), s, e) for s in range(9) for e in range(s, min(9, s + 4))
             if valid[b, s] and valid[b, e] and segments[b, s] == segments[b, e]),
            reverse=True,
        )[:6]  # fmt: skip
        found = [(float(x), int(s), int(e)) for x, s, e in zip(scores[b], starts[b], ends[b])]
        assert [(s, e) for _, s, e in found[: len(every)]] == [(s, e) for _, s, e in every]
        assert [x for x, _, _ in found[: len(every)]] == pytest.approx([x for x, _, _ in every])
        assert all(x == float("-inf") for x, _, _ in found[len(every) :])
    assert int((scores[2] > float("-inf")).sum()) == 1


@pytest.mark.parametrize("seed", range(3))
def test_distinct_top_spans_share_no_token_and_are_the_greedy_choice(seed):
    """overlapping=False (the hub's default): the best span, then the best that overlaps none taken, and so on."""
    gen = torch.Generator().manual_seed(seed)
    start, end = torch.randn(2, 12, generator=gen), torch.randn(2, 12, generator=gen)
    valid = torch.rand(2, 12, generator=gen) > 0.2
    starts, ends, scores = top_spans(start, end, valid, 4, 5, overlapping=False)
    for b in range(2):
        left = {(s, e): float(start[b, s] + end[b, e]) for s in range(12) for e in range(s, min(12, s + 4))
                if valid[b, s] and valid[b, e]}  # fmt: skip
        for x, s, e in zip(scores[b].tolist(), starts[b].tolist(), ends[b].tolist()):
            if not left:
                assert x == float("-inf")
                continue
            assert x == pytest.approx(max(left.values())) and left[(s, e)] == pytest.approx(x)
            left = {(s2, e2): v for (s2, e2), v in left.items() if e2 < s or s2 > e}


def test_best_span_of_a_row_without_valid_positions():
    starts, ends, scores = best_spans(torch.randn(1, 4), torch.randn(1, 4), torch.zeros(1, 4, dtype=torch.bool), 3)
    assert scores[0] == float("-inf") and starts[0] == ends[0] == 0
    with pytest.raises(ValueError, match="longest answer"):
        best_spans(torch.randn(1, 4), torch.randn(1, 4), torch.ones(1, 4, dtype=torch.bool), 0)


def test_candidate_log_softmax_ranks_only_candidates():
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0], [3.0, 0.0, 0.0, 0.0]])
    positions = torch.tensor([[0, 2, 3], [0, -1, -1]])
    log_p = candidate_log_softmax(logits, positions)
    assert torch.allclose(log_p[0], torch.log_softmax(torch.tensor([0.0, 1.0, 2.0]), -1))
    assert log_p[1, 0] == 0 and torch.isinf(log_p[1, 1:]).all()
