"""The Cluster-Former QA model: fairseq's RoBERTa whose layers run on question + context windows.

Extended the way fairseq's Linformer RoBERTa is (subclass ``RobertaModel`` / ``RobertaEncoder`` and override
``build_encoder``): embeddings and parameter names stay RoBERTa's, so a pretrained checkpoint loads into every
layer, the long-range layers included; the QA heads are new. A Hugging Face BERT or RoBERTa imported by
``fairseq-clusterformer-import-hf`` loads the same way: ``--roberta-path`` to its directory also sets the encoder
arguments its weights need (``--layer-norm-eps``, ``--type-vocab-size``, sizes, activation, positions).
"""

from __future__ import annotations

import os
import re

from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import (
    RobertaEncoder,
    RobertaModel,
    base_architecture,
    init_bert_params,
    roberta_base_architecture,
    roberta_large_architecture,
)
from fairseq.utils import safe_getattr
from omegaconf import OmegaConf

from fairseq_clusterformer.checkpoints.old_layouts import grow_answer_types
from fairseq_clusterformer.compat.arch_defaults import set_defaults
from fairseq_clusterformer.layers.build import configure_layers
from fairseq_clusterformer.layers.centroid_check import check_centroids_loaded
from fairseq_clusterformer.layers.compiled import COMPILE_CHOICES, DEFAULT_COMPILE
from fairseq_clusterformer.layers.flex import ATTENTION_BACKENDS
from fairseq_clusterformer.layers.kinds import LongRangePlan, long_range_choices, long_range_help, settings_by_flag
from fairseq_clusterformer.layers.settings import (
    LONG_RANGE_MODE_CHOICES,
    WINDOW_MERGE_CHOICES,
    LayerSettings,
    parse_layer_list,
)
from fairseq_clusterformer.qa.data.records import ANSWER_TYPES
from fairseq_clusterformer.qa.encoder import ClusterFormerQAEncoder
from fairseq_clusterformer.qa.heads import QAHeads
from fairseq_clusterformer.qa.ops.windows import QUESTION_SPECIALS
from fairseq_clusterformer.qa.pretrained import (
    NEW_PREFIX,
    adapt_roberta_state,
    check_imported_args,
    imported_encoder_args,
    load_roberta_state,
    pretrained_dictionary,
)

UNSUPPORTED = {
    "encoder_layerdrop": "--encoder-layerdrop",
    "encoder_layers_to_keep": "--encoder-layers-to-keep",
    "quant_noise_pq": "--quant-noise-pq",
    "checkpoint_activations": "--checkpoint-activations",
    "untie_weights_roberta": "--untie-weights-roberta",
}


def qa_layer_settings(args) -> LayerSettings:
    return LayerSettings(
        embed_dim=args.encoder_embed_dim,
        ffn_dim=args.encoder_ffn_embed_dim,
        heads=args.encoder_attention_heads,
        window_size=args.window_size,
        window_stride=args.window_stride,
        causal=False,  # QA reads the whole context both ways
        normalize_before=args.encoder_normalize_before,
        dropout=args.dropout,
        attention_dropout=args.attention_dropout,
        activation_dropout=args.activation_dropout,
        activation_fn=args.activation_fn,
        window_merge=args.window_merge,
    )


def qa_long_range_plan(args) -> LongRangePlan:
    return LongRangePlan(
        layers=parse_layer_list(args.long_range_layers, args.encoder_layers),
        kind=args.long_range_layer,
        num_clusters=args.num_clusters,
        causality="paper",  # only causal layers look at it
        mode=str(safe_getattr(args, "long_range_mode", "replace")),  # checkpoints from before the flag: replace
    )


class ClusterFormerQARobertaEncoder(RobertaEncoder):
    """RoBERTa's encoder with windowed layers and no masked-LM head (QA never uses it)."""

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = ClusterFormerQAEncoder(
            args, dictionary, embed_tokens, qa_layer_settings(args), qa_long_range_plan(args)
        )
        encoder.apply(init_bert_params)
        return encoder

    def build_lm_head(self, embed_dim, output_dim, activation_fn, weight):
        return None


@register_model("clusterformer_qa")
class ClusterFormerQAModel(RobertaModel):
    # what the console scripts call it
    checkpoint_kind = "a question-answering (clusterformer_qa) checkpoint"

    def __init__(self, args, encoder, answer_types: bool):
        super().__init__(args, encoder)
        self.qa_heads = QAHeads(args.encoder_embed_dim, answer_types, args.pooler_activation_fn, args.pooler_dropout)
        self.qa_heads.apply(init_bert_params)
        self.pretrained_dict_path = None  # the pretrained dict.txt while a RoBERTa state dict is being loaded

    @classmethod
    def hub_models(cls):
        # RoBERTa's names point at fairseq's RoBERTa checkpoints: none of them is a QA model
        return {}

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file=None, data_name_or_path=None, cpu=False, **kwargs):
        """fairseq's hub convention for a trained checkpoint: returns a ``qa/hub.py`` interface whose
        ``answer(question, context)`` gives answers with their character spans; without ``checkpoint_file`` the
        folder's checkpoint_best.pt, else its checkpoint_last.pt (``qa/hub_loading.py`` also says where the
        data folder and the tokeniser are found). ``max_context_eval`` / ``max_answer_tokens`` override the task's;
        the layers run in float32 unless ``autocast_bf16=True``."""
        from fairseq_clusterformer.qa.hub_loading import load_hub  # that module builds this class's checkpoints

        return load_hub(model_name_or_path, checkpoint_file, data_name_or_path, cpu, **kwargs)

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        parser.add_argument("--window-size", type=int, help="context tokens per window (l)")
        parser.add_argument("--window-stride", type=int, help="window stride m (< --window-size)")
        parser.add_argument("--long-range-layers", type=str, help="comma-separated 1-based long-range layer numbers")
        # read from layers/kinds.py when the parser is built: a kind registered after import is offered too
        parser.add_argument("--long-range-layer", choices=long_range_choices(), help=long_range_help())
        parser.add_argument(
            "--long-range-mode",
            choices=LONG_RANGE_MODE_CHOICES,
            help="'replace' (the paper): long-range attention instead of the sliding window; 'hybrid': the sliding "
            "window kept, long-range attention added through a per-head gate that starts at 0 (docs/qa.md)",
        )
        parser.add_argument("--num-clusters", type=int, help="clusters (or LSH buckets) per long-range layer")
        parser.add_argument("--window-merge", choices=WINDOW_MERGE_CHOICES, help="what overlapping windows average")
        parser.add_argument(
            "--compile-layers",
            choices=COMPILE_CHOICES,
            help="torch.compile the layers' forward; 'auto' (the default): on CUDA only (docs/gpu_speed.md)",
        )
        parser.add_argument(
            "--attention-backend",
            choices=ATTENTION_BACKENDS,
            help="'flex': FlexAttention in the long-range layers (CUDA for training; docs/gpu_speed.md)",
        )
        parser.add_argument("--roberta-path", type=str, help="pretrained fairseq RoBERTa: model.pt or its directory")
        parser.add_argument("--roberta-dict", type=str, help="the pretrained dict.txt (default: beside the checkpoint)")
        parser.add_argument("--layer-norm-eps", type=float, help="epsilon of every layer norm (BERT: 1e-12)")
        parser.add_argument(
            "--type-vocab-size",
            type=int,
            help="token types (BERT: 2): the question block is type 0, the context type 1; 0 = no type embeddings",
        )

    @classmethod
    def computing_settings(cls, args) -> dict[str, object]:
        """What the model computes, by flag: a resumed checkpoint must agree (``checkpoints.model_fit``)."""
        return settings_by_flag(qa_layer_settings(args), qa_long_range_plan(args), "encoder")

    @classmethod
    def build_model(cls, args, task):
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)  # the architecture functions fill in defaults, as RoBERTa's do
        clusterformer_qa_base(args)
        for name, flag in UNSUPPORTED.items():
            if safe_getattr(args, name, None):
                raise ValueError(f"{flag} is not supported by the clusterformer_qa model")
        if safe_getattr(args, "roberta_path", None):
            check_imported_args(args)
        window = task.max_question_tokens + QUESTION_SPECIALS + args.window_size
        if window > args.max_positions:
            raise ValueError(
                f"a window holds up to {window} tokens (<s> + --max-question-tokens {task.max_question_tokens} + "
                f"</s></s> + --window-size {args.window_size}), more than --max-positions {args.max_positions}"
            )
        encoder = ClusterFormerQARobertaEncoder(args, task.source_dictionary)
        model = cls(args, encoder, answer_types=task.answer_types)
        configure_layers(model.modules(), args.compile_layers, args.attention_backend)
        if safe_getattr(args, "roberta_path", None):
            model.load_roberta(args.roberta_path, args.roberta_dict)
        model.register_load_state_dict_post_hook(check_centroids_loaded)
        return model

    def load_roberta(self, path: str, dict_path: str | None = None) -> None:
        """Load a fairseq RoBERTa checkpoint into every layer; the QA heads and centroids stay as built."""
        if not dict_path:
            beside = os.path.join(path if os.path.isdir(path) else os.path.dirname(path), "dict.txt")
            dict_path = beside if os.path.isfile(beside) else None
        self.load_state_dict(load_roberta_state(path), strict=True, dict_path=dict_path)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None, dict_path=None):
        self.pretrained_dict_path = dict_path
        try:
            return super().load_state_dict(state_dict, strict, model_cfg, args)
        finally:
            self.pretrained_dict_path = None

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        if not any(k.startswith(prefix + NEW_PREFIX) for k in state_dict):
            # a RoBERTa checkpoint (--roberta-path or --restore-file), not one of ours. fairseq 0.12.2's encoder layers
            # add fused copies of their weights for the BetterTransformer path (layers.N.in_proj_weight, fc1_weight,
            # ...) to any state dict they load; the separate weights they copy stay, so the copies are dropped
            for key in [k for k in state_dict if k.startswith(prefix) and BT_COPY.search(k)]:
                del state_dict[key]
            dict_path = self.pretrained_dict_path or safe_getattr(self.args, "roberta_dict", None)
            adapt_roberta_state(self, state_dict, prefix, pretrained_dictionary(dict_path))
        elif self.qa_heads.answer_type is not None:
            grow_answer_types(state_dict, prefix, ANSWER_TYPES)  # a checkpoint from before the yes / no classes

    def forward(self, question, context, **unused):
        """question: B x q ids (no <s>/</s>), context: B x T ids, both right-padded. Returns a dict of logits:
        start / end (B x T) and, for answer-type data, answer_type (B x len(ANSWER_TYPES)) and paragraph (B x T)."""
        return self.qa_heads(self.encoder.sentence_encoder.forward_qa(question, context))

    def max_positions(self):
        return None  # a QA example is any number of windows; the task limits context lengths


BT_COPY = re.compile(r"\.layers\.\d+\.(in_proj|out_proj|fc1|fc2)_(weight|bias)$")


def _window_defaults(
    args, layers: str, num_clusters: int = 512, window: int = 256, stride: int = 224, positions: int = 512
) -> None:
    # an imported Hugging Face encoder fixes the sizes, activation and positions before the architecture's defaults
    set_defaults(args, **imported_encoder_args(safe_getattr(args, "roberta_path", None)))
    set_defaults(args, layer_norm_eps=1e-5, type_vocab_size=0)  # fairseq's LayerNorm default; RoBERTa has no types
    set_defaults(
        args,
        window_size=window,
        window_stride=stride,
        long_range_layers=layers,
        long_range_layer="cluster",
        long_range_mode="replace",
        num_clusters=num_clusters,
        window_merge="layer",
        max_positions=positions,
        roberta_path=None,
        roberta_dict=None,
        compile_layers=DEFAULT_COMPILE,
        attention_backend="eager",
    )


@register_model_architecture("clusterformer_qa", "clusterformer_qa_large")
def clusterformer_qa_large(args):
    """The paper's model: RoBERTa-large (24 layers, 1024 dims, 16 heads), Cluster-Former layers 15 and 20,
    windows of 256 context tokens with stride 224."""
    _window_defaults(args, "15,20")
    roberta_large_architecture(args)


@register_model_architecture("clusterformer_qa", "clusterformer_qa")
def clusterformer_qa_base(args):
    """RoBERTa-base (12 layers, 768 dims, 12 heads) with long-range layers 8 and 10."""
    _window_defaults(args, "8,10")
    roberta_base_architecture(args)


@register_model_architecture("clusterformer_qa", "clusterformer_qa_base")
def clusterformer_qa_base_arch(args):
    clusterformer_qa_base(args)


@register_model_architecture("clusterformer_qa", "clusterformer_qa_tiny")
def clusterformer_qa_tiny(args):
    """For tests: 4 layers of 64 dims, long-range layers 2 and 4, 16 clusters, windows of 32 with stride 24."""
    _window_defaults(args, "2,4", num_clusters=16, window=32, stride=24, positions=128)
    set_defaults(
        args,
        encoder_layers=4,
        encoder_embed_dim=64,
        encoder_ffn_embed_dim=256,
        encoder_attention_heads=4,
        dropout=0.1,
        attention_dropout=0.1,
    )
    base_architecture(args)
