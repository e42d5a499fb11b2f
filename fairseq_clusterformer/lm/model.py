"""The Cluster-Former language model: fairseq's transformer_lm with windowed and clustered layers."""

import logging
from dataclasses import dataclass, field

from fairseq import options
from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
)
from fairseq.modules import AdaptiveInput
from fairseq.utils import safe_getattr

from fairseq_clusterformer.checkpoints.dictionary import check_dictionary, dictionary_file, record_dictionary
from fairseq_clusterformer.layers.build import configure_layers
from fairseq_clusterformer.layers.centroid_check import check_centroids_loaded
from fairseq_clusterformer.layers.compiled import COMPILE_CHOICES, DEFAULT_COMPILE
from fairseq_clusterformer.layers.flex import ATTENTION_BACKENDS
from fairseq_clusterformer.layers.kinds import (
    LongRangePlan,
    is_grouped,
    long_range_choices,
    long_range_help,
    settings_by_flag,
)
from fairseq_clusterformer.layers.settings import (
    CAUSALITY_CHOICES,
    LONG_RANGE_MODE_CHOICES,
    LONG_RANGE_VALUE_CHOICES,
    SLIDING_WINDOW_CHOICES,
    WINDOW_MERGE_CHOICES,
    LayerSettings,
    parse_layer_list,
)
from fairseq_clusterformer.lm.decoder import ClusterFormerDecoder
from fairseq_clusterformer.lm.run_checks import check_finite_scores, warn_window_covers_sample
from fairseq_clusterformer.ops.cluster_groups import default_groups, segment_groups
from fairseq_clusterformer.refresh.refresher import check_refreshed_in_training

logger = logging.getLogger(__name__)


@dataclass
class ClusterFormerLMConfig(TransformerLanguageModelConfig):
    # the paper's depth: with transformer_lm's default of 6, the default long-range layers 11,15 would not exist
    decoder_layers: int = field(default=16, metadata={"help": "num decoder layers"})
    window_size: int = field(default=256, metadata={"help": "sliding-window size l (tokens per window)"})
    window_stride: int = field(default=128, metadata={"help": "sliding-window stride m (< --window-size)"})
    long_range_layers: str = field(
        default="11,15", metadata={"help": "comma-separated 1-based numbers of the long-range layers"}
    )
    # the kinds of layers/kinds.py when this module is imported: a ChoiceEnum cannot grow later
    long_range_layer: ChoiceEnum(long_range_choices()) = field(default="cluster", metadata={"help": long_range_help()})
    num_clusters: int = field(
        default=512,
        metadata={"help": "K-Means clusters per long-range layer (LSH buckets with --long-range-layer lsh; even)"},
    )
    window_merge: ChoiceEnum(WINDOW_MERGE_CHOICES) = field(
        default="layer",
        metadata={
            "help": "'layer' (the paper): every window runs the whole layer and overlapping outputs are averaged; "
            "'attention' (faster): only attention outputs are averaged and the FFN runs once per token"
        },
    )
    sliding_windows: ChoiceEnum(SLIDING_WINDOW_CHOICES) = field(
        default="overlap",
        metadata={
            "help": "the sliding-window layers: 'overlap' (the paper) averages the outputs of overlapping windows, "
            "in one of which a token may see no earlier token; 'band': every token attends to exactly its "
            "--window-size - 1 predecessors (same reach, no averaging)"
        },
    )
    cluster_causality: ChoiceEnum(CAUSALITY_CHOICES) = field(
        default="strict",
        metadata={
            "help": "'strict': a token attends to the most recent earlier tokens of its group of neighbouring "
            "clusters (depends on the past only); 'paper': windows of the sorted sequence as in the paper (leaks "
            "future tokens)"
        },
    )
    long_range_values: ChoiceEnum(LONG_RANGE_VALUE_CHOICES) = field(
        default="own",
        metadata={
            "help": "strict long-range layers: 'own' (the paper) gives every key its own value; 'next' gives every "
            "earlier key the value of the token after it, so a query reads what followed the earlier states that "
            "resemble it (an induction step across clusters)"
        },
    )
    long_range_mode: ChoiceEnum(LONG_RANGE_MODE_CHOICES) = field(
        default="replace",
        metadata={
            "help": "'replace' (the paper): the long-range layer replaces the sliding window; 'hybrid' keeps it and "
            "adds the long-range attention through a gate (the QA encoder only: the language model refuses it)"
        },
    )
    cluster_groups: int = field(
        default=0,
        metadata={
            "help": "strict causality: groups of neighbouring clusters (balanced by the memory bank's cluster "
            "populations) that a token draws its --window-size - 1 keys from; 0 = --tokens-per-sample / "
            "(2 x --window-size), at most --num-clusters"
        },
    )
    compile_layers: ChoiceEnum(COMPILE_CHOICES) = field(
        default=DEFAULT_COMPILE,
        metadata={
            "help": "run every windowed and long-range layer's forward through torch.compile(fullgraph=True) "
            "('auto', the default: on CUDA only, eager on a CPU); the cached one-token generation step stays eager. "
            "See docs/gpu_speed.md"
        },
    )
    attention_backend: ChoiceEnum(ATTENTION_BACKENDS) = field(
        default="eager",
        metadata={
            "help": "'flex': the layers' attention as one FlexAttention call (CUDA for training; no attention "
            "dropout); 'eager': scaled_dot_product_attention on windows. See docs/gpu_speed.md"
        },
    )


def _reject_unsupported(args) -> None:
    """Flags of transformer_lm that the windowed layers do not implement: refuse them rather than ignore them."""
    unsupported = {
        "character_embeddings": "--character-embeddings",
        "decoder_layers_to_keep": "--decoder-layers-to-keep",
        "checkpoint_activations": "--checkpoint-activations",
        "quant_noise_pq": "--quant-noise-pq",
        "base_layers": "--base-layers",
        # NormFormer's extra scalings and xFormers attention live in fairseq's TransformerDecoderLayer, which the
        # windowed layers replace
        "scale_attn": "--scale-attn",
        "scale_fc": "--scale-fc",
        "scale_heads": "--scale-heads",
        "scale_resids": "--scale-resids",
        "decoder_xformers_att_config": "--decoder-xformers-att-config",
    }
    for name, flag in unsupported.items():
        if safe_getattr(args, name, None):
            raise ValueError(f"{flag} is not supported by the clusterformer_lm model")
    if str(safe_getattr(args, "long_range_mode", "replace")) != "replace":
        raise ValueError(
            "--long-range-mode hybrid is built for the QA encoder (clusterformer_qa) only: the language model's causal "
            "long-range layers (strict head sets, the generation cache) have no hybrid form; use --long-range-mode "
            "replace"
        )


def layer_settings(args) -> LayerSettings:
    return LayerSettings(
        embed_dim=args.decoder_embed_dim,
        ffn_dim=args.decoder_ffn_embed_dim,
        heads=args.decoder_attention_heads,
        window_size=args.window_size,
        window_stride=args.window_stride,
        causal=True,
        normalize_before=args.decoder_normalize_before,
        dropout=args.dropout,
        attention_dropout=args.attention_dropout,
        activation_dropout=safe_getattr(args, "activation_dropout", 0.0) or safe_getattr(args, "relu_dropout", 0.0),
        activation_fn=args.activation_fn,
        window_merge=str(safe_getattr(args, "window_merge", "layer")),
        sliding_windows=str(safe_getattr(args, "sliding_windows", "overlap")),
    )


def band_groups(args) -> int:
    """--cluster-groups as given (LongRangePlan refuses one above --num-clusters), or for 0 its default for the
    training segment length, logged where the strict long-range layers use it.

    The default is capped at --num-clusters. That changes no existing model: a checkpoint stores 0 and comes here
    again when it is loaded, and before the cap a default above --num-clusters stopped the build of every strict
    cluster / LSH model, so none was trained with one; other layers and causalities never read the count. Where the
    default fitted, the cap leaves it as it was."""
    groups = safe_getattr(args, "cluster_groups", 0) or 0
    if groups != 0:
        return groups
    tokens = int(safe_getattr(args, "tokens_per_sample", None) or args.max_target_positions)
    groups = default_groups(tokens, args.window_size, args.num_clusters)
    if is_grouped(str(args.long_range_layer)) and str(args.cluster_causality) == "strict":
        wanted = segment_groups(tokens, args.window_size)
        capped = f" = {wanted}, capped at --num-clusters {args.num_clusters}" if groups < wanted else ""
        logger.info(
            f"--cluster-groups 0 -> {groups} (--tokens-per-sample {tokens} / (2 x --window-size {args.window_size})"
            f"{capped})"
        )
    return groups


def long_range_plan(args) -> LongRangePlan:
    return LongRangePlan(
        layers=parse_layer_list(args.long_range_layers, args.decoder_layers),
        kind=args.long_range_layer,
        num_clusters=args.num_clusters,
        causality=args.cluster_causality,
        band_groups=band_groups(args),
        values=str(safe_getattr(args, "long_range_values", "own")),
        mode=str(safe_getattr(args, "long_range_mode", "replace")),
    )


@register_model("clusterformer_lm", dataclass=ClusterFormerLMConfig)
class ClusterFormerLanguageModel(TransformerLanguageModel):
    """``ClusterFormerLanguageModel.from_pretrained(checkpoint_dir, "checkpoint_best.pt", data_name_or_path=data_bin)``
    (fairseq's own loader) returns fairseq's ``GeneratorHubInterface``: ``lm.sample(text)``, ``lm.score(text)``,
    ``lm.generate(tokens)`` as for transformer_lm, generating from the decoder's cache."""

    # what the console scripts call it
    checkpoint_kind = "a Cluster-Former language-model (clusterformer_lm) checkpoint"

    @classmethod
    def hub_models(cls):
        # transformer_lm's names point at transformer_lm checkpoints: none of them is a Cluster-Former model
        return {}

    @classmethod
    def computing_settings(cls, args) -> dict[str, object]:
        """What the model computes, by flag: a resumed checkpoint must agree (``checkpoints.model_fit``)."""
        return settings_by_flag(layer_settings(args), long_range_plan(args), "decoder")

    @classmethod
    def build_model(cls, args, task):
        _reject_unsupported(args)
        warn_window_covers_sample(args)
        if safe_getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = safe_getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
        dictionary = task.source_dictionary
        if args.adaptive_input:
            embed_tokens = AdaptiveInput(
                len(dictionary),
                dictionary.pad(),
                args.decoder_input_dim,
                args.adaptive_input_factor,
                args.decoder_embed_dim,
                options.eval_str_list(args.adaptive_input_cutoff, type=int),
                args.quant_noise_pq,
                args.quant_noise_pq_block_size,
            )
        else:
            embed_tokens = cls.build_embedding(args, dictionary, args.decoder_input_dim)
        if args.tie_adaptive_weights and not (
            args.adaptive_input and args.adaptive_softmax_cutoff == args.adaptive_input_cutoff
        ):
            raise ValueError("--tie-adaptive-weights needs --adaptive-input with equal input and softmax cutoffs")
        decoder = ClusterFormerDecoder(
            TransformerConfig.from_namespace(args),
            layer_settings(args),
            long_range_plan(args),
            task.target_dictionary,
            embed_tokens,
        )
        model = cls(decoder)
        configure_layers(
            model.modules(),
            str(safe_getattr(args, "compile_layers", DEFAULT_COMPILE)),
            str(safe_getattr(args, "attention_backend", "eager")),
        )
        record_dictionary(model, dictionary, dictionary_file(task))
        model.register_load_state_dict_post_hook(check_centroids_loaded)
        return model

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        # every path that loads a checkpoint comes here, with or without --task clusterformer_lm
        check_dictionary(self, state_dict)
        return super().load_state_dict(state_dict, strict, model_cfg, args)

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        probs = super().get_normalized_probs(net_output, log_probs, sample)
        if sample is not None and not self.training:  # a scoring pass (run_checks.py)
            check_finite_scores(probs)
        return probs

    def train(self, mode: bool = True):
        # only training calls train(): fairseq-eval-lm and generation never do, whatever the task
        if mode:
            check_refreshed_in_training(self)
        return super().train(mode)
