"""The QA encoder: RoBERTa's embeddings and layers, run over question + context windows.

B = batch, K = windows, Q = question block, T = context tokens, W = Q + l tokens per window, S = flat length,
C = channels.

fairseq's TransformerEncoder keeps its embeddings (token, learned positions, embedding layer norm) and its
parameter names, so a RoBERTa checkpoint loads unchanged; its layers are replaced by windowed ones:
sliding-window layers on ``[<s> question </s></s> context-window]`` windows (the context ends in ``</s>``) and, at
the long-range positions, the layer that ``build_layer`` makes (Cluster-Former, LSH, sparse) on the flat eq.-3
sequence of every window's question copy plus the merged context. A hybrid long-range layer (``--long-range-mode
hybrid``, ``layers.hybrid``) runs on that flat sequence too, and is handed the question + context windows for the
sliding-window attention it keeps.

Token types (``--type-vocab-size``, an imported BERT's 2; 0 for fairseq's RoBERTa, which has none): the encoder
derives them from the layout, as BertForQuestionAnswering's sentence pairs have them: every position of a window's
question block (``<s> question </s></s>`` and its pads) is type 0, every context position type 1 (0 when the model
has one type, as HF RoBERTa's). Their embedding is added to the token embedding before the positions, in the
source model's order. ``--layer-norm-eps`` sets the epsilon of every layer norm (BERT's is 1e-12, fairseq's 1e-5).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from fairseq import utils
from fairseq.models.transformer import TransformerEncoder
from fairseq.utils import safe_getattr
from torch import Tensor, nn

from fairseq_clusterformer.layers.build import build_layer
from fairseq_clusterformer.layers.compiled import compilable
from fairseq_clusterformer.layers.hybrid import HybridLongRange
from fairseq_clusterformer.layers.kinds import NO_LONG_RANGE, LongRangePlan
from fairseq_clusterformer.layers.settings import LayerSettings
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from fairseq_clusterformer.ops.precision import bf16_layers
from fairseq_clusterformer.qa.ops.windows import (
    QUESTION_SPECIALS,
    QAInputWindows,
    QALayout,
    QAWindows,
    close_context,
    from_flat,
    qa_tokens,
)


@dataclass
class QAEncoderOut:
    question: Tensor  # B x K x Q x C, every window's question copy
    context: Tensor  # B x T x C, merged context states
    question_valid: Tensor  # B x K x Q, False at pads and in windows that hold none of the example's context
    layout: QALayout


@compilable
def qa_window_pass(
    layer: SlidingWindowLayer, x: Tensor, padding_mask: Tensor, question_len: int, context_len: int, first: bool
) -> Tensor:
    """One sliding-window layer on every question + context window: x is B x (K*W) x C already cut into windows
    (``first``) or the flat B x S x C sequence; returns B x S x C. The layout is rebuilt from its lengths here, so that
    ``--compile-layers`` compiles it with the lengths symbolic after the first one."""
    layout = QALayout(question_len, context_len, layer.settings.window_size, layer.settings.window_stride)
    return layer.run_windows(x, QAInputWindows(layout) if first else QAWindows(layout), padding_mask)


def check_first_layer(layers: frozenset[int], kind: str) -> None:
    if 1 in layers and kind != NO_LONG_RANGE:
        raise ValueError(
            "--long-range-layers may not include layer 1: a long-range layer runs on the merged states of a "
            "sliding-window layer below it (paper section 3.2)"
        )


class ClusterFormerQAEncoder(TransformerEncoder):
    """fairseq's TransformerEncoder (named ``sentence_encoder`` inside RoBERTa) with windowed layers."""

    def __init__(self, args, dictionary, embed_tokens, settings: LayerSettings, plan: LongRangePlan) -> None:
        check_first_layer(plan.layers, plan.kind)
        # let the base class build the embeddings but no layers, then put the windowed layers in their place
        base_args = copy.deepcopy(args)
        base_args.encoder_layers = 0
        super().__init__(base_args, dictionary, embed_tokens)
        self.args = args
        self.settings = settings
        self.bos, self.eos = dictionary.bos(), dictionary.eos()
        # --autocast-bf16 outside training (compat.autocast_bf16.set_bf16_layers): the layers in bfloat16, the last
        # layer norm and the heads in float32
        self.bf16_layers = False
        # the first layer's windows carry their own position embeddings, so it always merges whole layer outputs
        first = dataclasses.replace(settings, window_merge="layer")
        self.layers.extend(build_layer(i + 1, first if i == 0 else settings, plan) for i in range(args.encoder_layers))
        self.num_layers = len(self.layers)
        types = safe_getattr(args, "type_vocab_size", 0)
        self.embed_token_types = nn.Embedding(types, embed_tokens.embedding_dim) if types else None
        if self.embed_token_types is not None and self.embed_scale != 1.0:
            raise ValueError("--type-vocab-size needs --no-scale-embedding: BERT does not scale its embeddings")
        # fairseq builds every LayerNorm with its default epsilon; the module reads ``eps`` at every call
        eps = safe_getattr(args, "layer_norm_eps", 1e-5)
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                module.eps = eps

    def layout(self, question: Tensor, context: Tensor) -> QALayout:
        """``context`` as the layers see it, ``</s>`` included (see ``close_context``)."""
        size, stride = self.settings.window_size, self.settings.window_stride
        return QALayout(question.size(1) + QUESTION_SPECIALS, context.size(1), size, stride)

    def forward_qa(self, question: Tensor, context: Tensor) -> QAEncoderOut:
        """question: B x q ids without <s>/</s>, context: B x T ids, both right-padded. The layers see RoBERTa's
        sentence-pair input, ``<s> question </s></s> context </s>``, cut into windows; ``context`` in the output
        holds the states of the T context positions only."""
        length = context.size(1)
        context = close_context(context, self.eos, self.padding_idx)  # B x (T+1)
        layout = self.layout(question, context)
        bsz = question.size(0)
        flat, tokens = qa_tokens(question, context, layout, self.bos, self.eos, self.padding_idx)  # B x S, B x K x W
        # positions restart in every window: embed each window as its own sequence (pads are skipped, so the
        # context follows the question of this example whatever the batch's longest question)
        windows = tokens.flatten(0, 1)  # (B*K) x W
        x, _ = self.forward_embedding(windows, self.typed_embedding(windows, layout))  # (B*K) x W x C
        x = x.reshape(bsz, -1, x.size(-1))  # B x K*W x C
        window_pad = tokens.eq(self.padding_idx).flatten(1)  # B x K*W
        flat_pad = flat.eq(self.padding_idx)  # B x S
        with bf16_layers(x, self.bf16_layers):
            x = self.run_layers(x, window_pad, flat_pad, layout)  # B x S x C
        x = x.float() if self.bf16_layers else x
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        question_states, context_states = from_flat(x, layout)
        question_pad, _ = from_flat(flat_pad, layout)
        return QAEncoderOut(question_states, context_states[:, :length], ~question_pad, layout)

    def run_layers(self, x: Tensor, window_pad: Tensor, flat_pad: Tensor, layout: QALayout) -> Tensor:
        """The layer stack over B x K*W window states; returns the B x S flat states."""
        first, *rest = self.layers
        x = qa_window_pass(first, x, window_pad, layout.question_len, layout.context_len, True)  # B x S x C
        for layer in rest:
            if isinstance(layer, SlidingWindowLayer):
                x = qa_window_pass(layer, x, flat_pad, layout.question_len, layout.context_len, False)
            elif isinstance(layer, HybridLongRange):
                # the sliding window it keeps is the one a sliding-window layer here would run: the QA windows
                x = layer(x, flat_pad, QAWindows(layout))
            else:
                x = layer(x, flat_pad)  # long-range layers: all question copies and the context at once
        return x

    def typed_embedding(self, windows: Tensor, layout: QALayout) -> Tensor | None:
        """Token plus token-type embeddings of windows ((B*K) x W ids), or None without token types (the base
        class then embeds the tokens alone)."""
        if self.embed_token_types is None:
            return None
        in_context = torch.arange(layout.window_len, device=windows.device) >= layout.question_len  # W
        types = in_context.long().clamp(max=self.embed_token_types.num_embeddings - 1)  # W
        return self.embed_tokens(windows) + self.embed_token_types(types)  # (B*K) x W x C

    def upgrade_state_dict_named(self, state_dict, name):
        """Older fairseq names inside a layer: ``layer_norms.{0,1}`` and a fused ``in_proj_weight``/``bias``
        (the base class would ask each layer to do this; the windowed layers keep no such history), then the
        base class's own ``version`` handling, which the published RoBERTa checkpoints need: they have no
        ``version`` entry, and fairseq adds one (and drops a final layer norm they never had)."""
        for i in range(self.num_layers):
            prefix = f"{name}.layers.{i}."
            for old, new in (("layer_norms.0", "self_attn_layer_norm"), ("layer_norms.1", "final_layer_norm")):
                for kind in ("weight", "bias"):
                    if prefix + f"{old}.{kind}" in state_dict:
                        state_dict[prefix + f"{new}.{kind}"] = state_dict.pop(prefix + f"{old}.{kind}")
            for kind in ("weight", "bias"):
                fused = state_dict.pop(prefix + f"self_attn.in_proj_{kind}", None)
                if fused is not None:
                    # fairseq fused q, k and v in this order along the output dimension
                    for proj, part in zip(("q_proj", "k_proj", "v_proj"), fused.chunk(3, dim=0)):
                        state_dict[prefix + f"self_attn.{proj}.{kind}"] = part
        version_key = f"{name}.version"
        if utils.item(state_dict.get(version_key, torch.Tensor([1]))[0]) < 2:
            # as fairseq's TransformerEncoderBase: these checkpoints did not normalise after the last layer
            self.layer_norm = None
            self.normalize = False
            state_dict[version_key] = torch.Tensor([1])
        return state_dict
