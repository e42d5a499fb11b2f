"""Output heads of the QA model (paper section 4.2).

B = batch, K = windows, Q = question block, T = context tokens, C = channels.
"""

from __future__ import annotations

import torch
from fairseq.models.roberta import RobertaClassificationHead
from torch import Tensor, nn

from fairseq_clusterformer.modules.qa_encoder import QAEncoderOut

ANSWER_TYPES = ("none", "long", "short")


class QAHeads(nn.Module):
    """Start/end logits over the context; for Natural Questions also the answer type (none / long / short) from
    the mean of every window's first state, and a paragraph-ranking logit per context token (only the paragraph
    tokens are ranked)."""

    def __init__(self, embed_dim: int, answer_types: bool, activation_fn: str, pooler_dropout: float) -> None:
        super().__init__()
        self.span = nn.Linear(embed_dim, 2)
        self.answer_type = (
            RobertaClassificationHead(embed_dim, embed_dim, len(ANSWER_TYPES), activation_fn, pooler_dropout)
            if answer_types
            else None
        )
        self.paragraph = nn.Linear(embed_dim, 1) if answer_types else None

    def forward(self, out: QAEncoderOut) -> dict[str, Tensor]:
        start, end = self.span(out.context).unbind(dim=-1)  # B x T each
        logits = {"start": start, "end": end}
        if self.answer_type is not None:
            first = out.question[:, :, 0]  # B x K x C, the <s> of every window
            own = out.question_valid[:, :, 0].to(first.dtype)  # B x K, windows holding this example's context
            pooled = (first * own[..., None]).sum(dim=1) / own.sum(dim=1, keepdim=True).clamp(min=1)  # B x C
            logits["answer_type"] = self.answer_type(pooled[:, None, :])  # B x 3
            logits["paragraph"] = self.paragraph(out.context)[..., 0]  # B x T
        return logits


def span_positions(context: Tensor, pad: int, paragraph: int) -> Tensor:
    """B x T: True where an answer may start or end (real context tokens, not paragraph markers)."""
    return context.ne(pad) & context.ne(paragraph)


def paragraph_positions(context: Tensor, paragraph: int) -> Tensor:
    """B x P indices of the paragraph tokens of every row, padded with -1 (P = most paragraphs in the batch)."""
    is_paragraph = context.eq(paragraph)  # B x T
    counts = is_paragraph.sum(dim=1)  # B
    width = max(int(counts.max().item()) if counts.numel() else 0, 1)
    # a stable sort by "not a paragraph token" lists each row's paragraph positions first, in order
    order = torch.sort((~is_paragraph).int(), dim=1, stable=True).indices[:, :width]  # B x P
    keep = torch.arange(width, device=context.device)[None, :] < counts[:, None]  # B x P
    return torch.where(keep, order, torch.full_like(order, -1))


def paragraph_ids(context: Tensor, paragraph: int) -> Tensor:
    """B x T: how many paragraph tokens come at or before each position (the paragraph a token belongs to)."""
    return context.eq(paragraph).cumsum(dim=1)
