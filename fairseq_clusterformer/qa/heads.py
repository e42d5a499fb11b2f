"""Output heads of the QA model (paper section 4.2). Decoding their logits into answers is ``qa/ops/spans.py``'s.

B = batch, K = windows, Q = question block, T = context tokens, C = channels.
"""

from __future__ import annotations

from fairseq.models.roberta import RobertaClassificationHead
from torch import Tensor, nn

from fairseq_clusterformer.qa.data.records import ANSWER_TYPES
from fairseq_clusterformer.qa.encoder import QAEncoderOut


class QAHeads(nn.Module):
    """Start/end logits over the context; for Natural Questions also the answer type (ANSWER_TYPES) from
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
            logits["answer_type"] = self.answer_type(pooled[:, None, :])  # B x len(ANSWER_TYPES)
            logits["paragraph"] = self.paragraph(out.context)[..., 0]  # B x T
        return logits
