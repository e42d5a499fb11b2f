"""Answer spans: where an answer may lie in a context, the marginal likelihood of a set of gold spans, and the
answer decoder (best span within one paragraph, answer type, best paragraph) that validation and prediction share.

B = batch, T = context tokens, G = gold spans per example (padded with -1), L = longest answer, P = candidates
(paragraphs). Spans are inclusive token indices [start, end] into the context; a context is a run of paragraphs,
each opening with a paragraph token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor


def span_positions(context: Tensor, pad: int, paragraph: int) -> Tensor:
    """B x T: True where an answer may start or end (real context tokens, not paragraph markers)."""
    return context.ne(pad) & context.ne(paragraph)


def paragraph_positions(context: Tensor, paragraph: int, width: int | None = None) -> Tensor:
    """B x P indices of the paragraph tokens of every row, padded with -1.

    width: P; None = the most paragraphs in the batch (read back from the device: a host sync, fine where the
    answers are decoded on the host anyway); a training step passes T, a bound that no row can exceed, so that the
    shape does not depend on the data (the extra columns are -1, which every user masks)."""
    is_paragraph = context.eq(paragraph)  # B x T
    counts = is_paragraph.sum(dim=1)  # B
    if width is None:
        width = max(int(counts.max().item()) if counts.numel() else 0, 1)
    width = max(min(width, context.size(1)), 1)
    # a stable sort by "not a paragraph token" lists each row's paragraph positions first, in order
    order = torch.sort((~is_paragraph).int(), dim=1, stable=True).indices[:, :width]  # B x P
    keep = torch.arange(width, device=context.device)[None, :] < counts[:, None]  # B x P
    return torch.where(keep, order, torch.full_like(order, -1))


def paragraph_ids(context: Tensor, paragraph: int) -> Tensor:
    """B x T: how many paragraph tokens come at or before each position (the paragraph a token belongs to)."""
    return context.eq(paragraph).cumsum(dim=1)


def at_least_float32(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def masked_log_softmax(logits: Tensor, valid: Tensor) -> Tensor:
    """log-softmax of B x N logits over the positions where ``valid`` (B x N) is True; -inf elsewhere.

    Computed in at least float32 so that a long context's normaliser does not lose precision in fp16.
    A row without any valid position is all -inf (callers drop such rows)."""
    masked = at_least_float32(logits).masked_fill(~valid, float("-inf"))
    norm = torch.logsumexp(masked, dim=-1, keepdim=True)  # B x 1
    return (masked - norm.nan_to_num(neginf=0.0)).masked_fill(~valid, float("-inf"))


def gold_span_log_likelihood(
    start_logits: Tensor, end_logits: Tensor, valid: Tensor, spans: Tensor
) -> tuple[Tensor, Tensor]:
    """log sum over the gold spans of p(start) p(end): marginal likelihood for distant supervision, where the
    answer text occurs several times and any occurrence may be the right one.

    start_logits / end_logits: B x T, valid: B x T (True where a span may start or end),
    spans: B x G x 2 inclusive (start, end), rows padded with -1.
    Returns (log-likelihood B, has_gold B): a row whose gold spans are all padding or invalid has
    log-likelihood 0 and has_gold False, so that summing over the batch leaves it out.
    """
    log_start = masked_log_softmax(start_logits, valid)  # B x T
    log_end = masked_log_softmax(end_logits, valid)  # B x T
    starts, ends = spans[..., 0], spans[..., 1]  # B x G
    real = (starts >= 0) & (ends >= starts)  # B x G
    per_span = log_start.gather(1, starts.clamp(min=0)) + log_end.gather(1, ends.clamp(min=0))  # B x G
    per_span = per_span.masked_fill(~real, float("-inf"))
    total = torch.logsumexp(per_span, dim=-1)  # B
    has_gold = torch.isfinite(total)
    return total.masked_fill(~has_gold, 0.0), has_gold


def span_band_scores(
    start_logits: Tensor, end_logits: Tensor, valid: Tensor, max_length: int, segments: Tensor | None = None
) -> Tensor:
    """B x T x L scores of every span: [b, s, j] = start_logit[s] + end_logit[s + j], -inf where the span may not be
    (s or e not valid, e beyond the context, s and e in different ``segments``). Built by ``unfold``, so a 10k-token
    context is one kernel."""
    if max_length < 1:
        raise ValueError(f"the longest answer must be at least one token, got {max_length}")
    bsz, length = start_logits.shape
    width = min(max_length, length)
    start = at_least_float32(start_logits).masked_fill(~valid, float("-inf"))  # B x T
    end = at_least_float32(end_logits).masked_fill(~valid, float("-inf"))  # B x T
    end = torch.cat([end, end.new_full((bsz, width - 1), float("-inf"))], dim=1)  # B x (T+L-1)
    band = end.unfold(1, width, 1)  # B x T x L, band[b, s, j] = end[b, s + j]
    scores = start[:, :, None] + band  # B x T x L
    if segments is not None:
        padded = torch.cat([segments, segments.new_full((bsz, width - 1), -1)], dim=1)  # B x (T+L-1)
        same = padded.unfold(1, width, 1) == segments[:, :, None]  # B x T x L
        scores = scores.masked_fill(~same, float("-inf"))
    return scores


def best_spans(
    start_logits: Tensor, end_logits: Tensor, valid: Tensor, max_length: int, segments: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Highest start_logit[s] + end_logit[e] with s <= e < s + max_length, s and e valid and, given
    ``segments`` (B x T ids, e.g. the paragraph of every token), s and e in the same segment: an answer never
    runs across a paragraph boundary, whose marker would otherwise sit inside the predicted text.

    Returns (starts B, ends B, scores B); a row with no valid position gets -inf and start = end = 0.
    """
    starts, ends, scores = top_spans(start_logits, end_logits, valid, max_length, 1, segments)
    return starts[:, 0], ends[:, 0], scores[:, 0]


def top_spans(
    start_logits: Tensor,
    end_logits: Tensor,
    valid: Tensor,
    max_length: int,
    k: int,
    segments: Tensor | None = None,
    overlapping: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """The ``k`` highest-scoring spans of every row under ``best_spans``' rules, best first: (starts B x k, ends
    B x k, scores B x k); where a row has fewer than ``k`` spans the rest score -inf with start = end = 0. With
    ``overlapping=False`` each span shares no token with a better one (``distinct_spans``)."""
    scores = span_band_scores(start_logits, end_logits, valid, max_length, segments)  # B x T x L
    if not overlapping and k > 1:
        return distinct_spans(scores, k)
    bsz, _, width = scores.shape
    flat = scores.reshape(bsz, -1)  # B x (T*L)
    if k == 1:
        best, at = flat.max(dim=-1, keepdim=True)  # B x 1; the one best span, as validation has always decoded it
    else:
        best, at = flat.topk(min(k, flat.size(1)), dim=-1)  # B x k'
    starts = at // width
    ends = starts + at % width
    found = torch.isfinite(best)
    zero = torch.zeros_like(starts)
    starts, ends = torch.where(found, starts, zero), torch.where(found, ends, zero)
    if best.size(1) < k:  # a context of fewer than k candidate spans: pad with none
        pad = k - best.size(1)
        starts, ends = (torch.cat([x, x.new_zeros(bsz, pad)], dim=1) for x in (starts, ends))
        best = torch.cat([best, best.new_full((bsz, pad), float("-inf"))], dim=1)
    return starts, ends, best


def distinct_spans(scores: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The ``k`` best spans of every row of ``span_band_scores`` (B x T x L) that share no token, chosen greedily:
    the best span, then the best of those that do not overlap it, and so on. The best spans of a trained model crowd
    around one answer ("52.9 million", "52.9 million people", "million"); a reader asking for alternatives wants
    other places of the text. (starts B x k, ends B x k, scores B x k) as ``top_spans``."""
    bsz, length, width = scores.shape
    span_start = torch.arange(length, device=scores.device)[:, None]  # T x 1
    span_end = span_start + torch.arange(width, device=scores.device)[None, :]  # T x L
    starts, ends, best = [], [], []
    for _ in range(k):
        score, at = scores.reshape(bsz, -1).max(dim=-1)  # B
        start, end = at // width, at // width + at % width  # B
        found = torch.isfinite(score)
        starts.append(torch.where(found, start, 0))
        ends.append(torch.where(found, end, 0))
        best.append(score)
        # spans [s, s + j] with s <= end and s + j >= start overlap the one just taken
        overlaps = (span_start[None] <= end[:, None, None]) & (span_end[None] >= start[:, None, None])  # B x T x L
        scores = scores.masked_fill(overlaps, float("-inf"))
    return torch.stack(starts, dim=1), torch.stack(ends, dim=1), torch.stack(best, dim=1)


def candidate_log_softmax(logits: Tensor, positions: Tensor) -> Tensor:
    """log-softmax of per-token logits B x T over candidate positions B x P (padded with -1): B x P,
    -inf at padding. Used to rank paragraphs by the logits of their paragraph tokens."""
    picked = logits.gather(1, positions.clamp(min=0))  # B x P
    return masked_log_softmax(picked, positions >= 0)


@dataclass(frozen=True)
class AnswerPrediction:
    """One question's decoded answer.

    ``answer_type`` is the class the answer-type head picks (an index into the data's answer types), None for a
    span-only model, which answers every question with its span. ``paragraph`` is the best-ranked paragraph (its
    index among the context's paragraph tokens) and ``paragraph_score`` its log-probability; both None without the
    answer-type heads. A context without any valid position gets start = end = 0 and span_score -inf.
    """

    answer_type: int | None
    start: int
    end: int
    span_score: float
    paragraph: int | None
    paragraph_score: float | None


def decode_answers(
    logits: Mapping[str, Tensor], context: Tensor, pad: int, paragraph: int, max_answer_tokens: int
) -> list[AnswerPrediction]:
    """The answer of every row of a batch from the QA heads' logits ("start", "end" B x T; with answer types also
    "answer_type" B x classes and "paragraph" B x T): the best span of at most ``max_answer_tokens`` tokens that
    neither starts nor ends on padding or a paragraph token and stays inside one paragraph, the argmax answer type
    and the best paragraph. One function for validation metrics and the prediction script, so they cannot differ."""
    valid = span_positions(context, pad, paragraph)  # B x T
    segments = paragraph_ids(context, paragraph)  # B x T
    starts, ends, scores = best_spans(logits["start"], logits["end"], valid, max_answer_tokens, segments)
    rows = len(starts)
    kinds: list[int | None] = [None] * rows
    paragraphs: list[int | None] = [None] * rows
    paragraph_scores: list[float | None] = [None] * rows
    if "answer_type" in logits:
        kinds = logits["answer_type"].argmax(dim=-1).tolist()
        log_p = candidate_log_softmax(logits["paragraph"], paragraph_positions(context, paragraph))  # B x P
        best, at = log_p.max(dim=-1)  # B
        paragraph_scores, paragraphs = best.tolist(), at.tolist()
    return [
        AnswerPrediction(*row)
        for row in zip(kinds, starts.tolist(), ends.tolist(), scores.tolist(), paragraphs, paragraph_scores)
    ]
