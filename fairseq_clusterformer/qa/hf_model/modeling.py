"""``ClusterFormerForQuestionAnswering``: the clusterformer_qa model behind transformers' interface.

B = batch, L = input tokens, Q = question tokens, T = context tokens.

The model holds the package's own fairseq model (``qa.model.ClusterFormerQAModel``, built from the configuration's
fairseq arguments), so the windows, the long-range layers and the heads compute exactly what fairseq computes. Its
input is the exported tokenizer's pair encoding, right-padded: ``<s> question </s></s> context </s>`` in Hugging
Face ids (BERT's ``[CLS] ... [SEP][SEP] ... [SEP]``), the context opening with the paragraph token ``<p>`` as the
binariser writes it. The forward maps the ids to the training dictionary's, cuts every row into its question and
context and returns the fairseq start / end logits at the context positions; the question block and the special
tokens get the lowest logit of the dtype, so no answer starts or ends there.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from fairseq.data import Dictionary
from torch import Tensor
from transformers import PreTrainedModel
from transformers.modeling_outputs import QuestionAnsweringModelOutput

from fairseq_clusterformer.qa.hf_model.configuration import ClusterFormerQAHFConfig
from fairseq_clusterformer.qa.model import ClusterFormerQAModel


def placeholder_dictionary(size: int) -> Dictionary:
    """A fairseq dictionary of ``size`` symbols: the model reads only its length and its special indices (fairseq's
    <s> <pad> </s> <unk> at 0-3, as every training dictionary of this package has them)."""
    dictionary = Dictionary()
    while len(dictionary) < size:
        dictionary.add_symbol(f"#{len(dictionary)}")
    return dictionary


def _derive_again(model: ClusterFormerForQuestionAnswering, incompatible_keys) -> None:
    """``load_state_dict`` post-hook (a module function: models pickle): derive the buffers again before the next
    forward."""
    model.derived_ready = False


class ClusterFormerForQuestionAnswering(PreTrainedModel):
    config_class = ClusterFormerQAHFConfig
    base_model_prefix = "clusterformer"
    main_input_name = "input_ids"

    def __init__(self, config: ClusterFormerQAHFConfig) -> None:
        super().__init__(config)
        dictionary = placeholder_dictionary(config.fairseq_vocab_size)
        task = SimpleNamespace(
            source_dictionary=dictionary,
            max_question_tokens=config.max_question_tokens,
            answer_types=config.answer_types,
        )
        self.clusterformer = ClusterFormerQAModel.build_model(config.fairseq_namespace(), task)
        self.bos, self.pad, self.eos = dictionary.bos(), dictionary.pad(), dictionary.eos()
        # Hugging Face id -> dictionary index (-1: an id the training dictionary has no row for)
        self.register_buffer("hf_to_fairseq", torch.full((config.vocab_size,), -1, dtype=torch.long))
        # buffers the layers derive rather than save (LSH's evaluation directions, the cluster groups): transformers
        # leaves them unset after loading, so they are put back before the first forward (``derive_buffers``)
        saved = self.clusterformer.state_dict(keep_vars=True)
        self.derived = {k: v.clone() for k, v in self.clusterformer.named_buffers() if k not in saved}
        self.derived_ready = False
        self.register_load_state_dict_post_hook(_derive_again)  # new cluster shares: new groups
        self.post_init()

    @classmethod
    def get_init_context(cls, *args, **kwargs):
        # built on the CPU, not on transformers' meta device: the layers compute buffers at construction (LSH's
        # evaluation directions from a fixed seed) that no checkpoint holds
        return [c for c in super().get_init_context(*args, **kwargs) if c != torch.device("meta")]

    def _init_weights(self, module) -> None:
        """Every weight comes from the exported checkpoint; nothing is drawn here."""

    def derive_buffers(self) -> None:
        for name, buffer in self.clusterformer.named_buffers():
            if name in self.derived:
                buffer.copy_(self.derived[name].to(buffer.device))
        for module in self.clusterformer.modules():
            if hasattr(module, "update_groups"):
                module.update_groups()  # the cluster groups, from the loaded cluster shares
        self.derived_ready = True

    def split_pair(self, input_ids: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(question B x Q, context B x T, in dictionary indices and right-padded; each row's first context position
        and context length, B each) of the pair encoding; ValueError when a row is not in that layout."""
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= self.hf_to_fairseq.numel():
            raise ValueError(f"input_ids outside the tokenizer's {self.hf_to_fairseq.numel()} ids")
        ids = self.hf_to_fairseq[input_ids]  # B x L
        if bool((ids < 0).any()):
            unknown = sorted(set(input_ids[ids < 0].tolist()))[:5]
            raise ValueError(f"input_ids {unknown} are tokens the model was not trained with (no dictionary row)")
        valid = attention_mask.bool() if attention_mask is not None else torch.ones_like(ids, dtype=torch.bool)
        length = valid.sum(dim=1)  # B
        positions = torch.arange(ids.size(1), device=ids.device)  # L
        eos = ids.eq(self.eos) & valid  # B x L
        first_eos = torch.where(eos, positions, ids.size(1)).min(dim=1).values  # B
        start = first_eos + 2  # B, after </s></s>
        context_len = length - 1 - start  # B, the closing </s> left out
        rows = torch.arange(ids.size(0), device=ids.device)
        last = (length - 1).clamp(min=0)
        well_formed = (
            ids[:, 0].eq(self.bos)
            & (first_eos > 1)  # a question of at least one token
            & valid.long().cumprod(dim=1).sum(dim=1).eq(length)  # right-padded: no hole in the mask
            & (context_len > 0)
            & ids[rows, start.clamp(max=ids.size(1) - 1) - 1].eq(self.eos)
            & ids[rows, last].eq(self.eos)
        )
        if not bool(well_formed.all()):
            bad = int((~well_formed).nonzero()[0])
            raise ValueError(
                f"row {bad} of input_ids is not '<s> question </s></s> context </s>' right-padded, the exported "
                "tokenizer's pair encoding (tokenizer(question, context)); no row may be cut or left-padded"
            )
        q_len = first_eos - 1  # B
        question = self.gather_rows(ids, torch.ones_like(q_len), q_len)  # B x Q
        context = self.gather_rows(ids, start, context_len)  # B x T
        return question, context, start, context_len

    def gather_rows(self, ids: Tensor, first: Tensor, count: Tensor) -> Tensor:
        """B x max(count): row b holds ids[b, first[b] : first[b] + count[b]], then pads."""
        offsets = torch.arange(int(count.max()), device=ids.device)  # N
        inside = offsets[None, :] < count[:, None]  # B x N
        index = (first[:, None] + offsets[None, :]).clamp(max=ids.size(1) - 1)  # B x N
        return torch.where(inside, ids.gather(1, index), self.pad)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        return_dict: bool | None = None,
        **unused,
    ) -> QuestionAnsweringModelOutput | tuple[Tensor, Tensor]:
        """input_ids, attention_mask: B x L (``token_type_ids`` are not read: the encoder gives the question block
        type 0 and the context type 1 itself). Returns start / end logits, B x L."""
        if start_positions is not None or end_positions is not None:
            raise NotImplementedError(
                "training through transformers is not supported: the Cluster-Former layers' centroids are refreshed "
                "by K-Means during fairseq-train, which this model does not run; fine-tune with fairseq-train"
            )
        if not self.derived_ready:
            self.derive_buffers()
        question, context, start, context_len = self.split_pair(input_ids, attention_mask)
        logits = self.clusterformer(question=question, context=context)
        offsets = torch.arange(context.size(1), device=input_ids.device)  # T
        index = (start[:, None] + offsets[None, :]).clamp(max=input_ids.size(1) - 1)  # B x T
        inside = offsets[None, :] < context_len[:, None]  # B x T
        out = []
        for name in ("start", "end"):
            full = logits[name].new_full(input_ids.shape, torch.finfo(logits[name].dtype).min)  # B x L
            out.append(full.scatter(1, torch.where(inside, index, 0), torch.where(inside, logits[name], full[:, :1])))
        if return_dict is False:
            return out[0], out[1]
        return QuestionAnsweringModelOutput(start_logits=out[0], end_logits=out[1])
