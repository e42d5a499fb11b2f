"""Output heads of the QA model (paper section 4.2). Decoding their logits into answers is ``qa/ops/spans.py``'s.

B = batch, K = windows, Q = question block, T = context tokens, C = channels.
"""

from __future__ import annotations

import logging

import torch
from fairseq.models.roberta import RobertaClassificationHead
from torch import Tensor, nn

from fairseq_clusterformer.qa.data.records import ANSWER_TYPES
from fairseq_clusterformer.qa.encoder import QAEncoderOut

logger = logging.getLogger(__name__)

# the bias of a class added to an older checkpoint's head: far below any logit a trained head gives, so the class
# never wins, and still finite in fp16
ADDED_CLASS_BIAS = -1e4


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


def add_missing_answer_types(state_dict: dict[str, Tensor], prefix: str) -> int:
    """Grow the answer-type head of a checkpoint trained with fewer classes (none / long / short, before yes / no
    were added after them) to ANSWER_TYPES; returns how many classes were added.

    The added classes get zero weights and ADDED_CLASS_BIAS: the checkpoint answers exactly as it was trained to
    (its own classes keep their logits, the new ones never win) instead of failing to load.
    """
    head = prefix + "qa_heads.answer_type.out_proj."
    weight_key, bias_key = head + "weight", head + "bias"
    if weight_key not in state_dict or bias_key not in state_dict:
        return 0
    weight, bias = state_dict[weight_key], state_dict[bias_key]
    missing = len(ANSWER_TYPES) - weight.shape[0]
    if missing <= 0:
        return 0  # the current head, or a larger one, which load_state_dict refuses by its shape
    state_dict[weight_key] = torch.cat([weight, weight.new_zeros(missing, weight.shape[1])])
    state_dict[bias_key] = torch.cat([bias, bias.new_full((missing,), ADDED_CLASS_BIAS)])
    kept = ", ".join(ANSWER_TYPES[: weight.shape[0]])
    logger.warning(
        f"the checkpoint's answer-type head has {weight.shape[0]} classes ({kept}): the classes "
        f"{', '.join(ANSWER_TYPES[weight.shape[0] :])} are added with bias {ADDED_CLASS_BIAS:g}, so it never predicts "
        "them; train from the pretrained model to learn them (resuming this training needs --reset-optimizer)"
    )
    return missing
