"""The registered architectures of ``clusterformer_lm`` (``--arch``): the paper's WikiText-103 and enwik8 models and a
tiny one for tests and the demo. Each fills only what the command line left unset, as fairseq's arch functions do."""

from fairseq.models import register_model_architecture
from fairseq.models.transformer_lm import base_lm_architecture, transformer_lm_baevski_wiki103

# the model first: an architecture registers against a registered model name
from fairseq_clusterformer.compat.arch_defaults import set_defaults
from fairseq_clusterformer.lm.model import ClusterFormerLanguageModel  # noqa: F401


def _long_range_defaults(args, layers: str, num_clusters: int = 512, window: int = 256, stride: int = 128) -> None:
    set_defaults(
        args,
        window_size=window,
        window_stride=stride,
        long_range_layers=layers,
        long_range_layer="cluster",
        num_clusters=num_clusters,
        cluster_causality="strict",
        cluster_groups=0,
        window_merge="layer",
        sliding_windows="overlap",
        long_range_values="own",
    )


@register_model_architecture("clusterformer_lm", "clusterformer_lm_wiki103")
def clusterformer_lm_wiki103(args):
    """The paper's WikiText-103 model: transformer_lm_wiki103 (16 layers, 8 heads, 1024 dims, adaptive
    input and softmax, dropout 0.3) with Cluster-Former layers 11 and 15."""
    _long_range_defaults(args, "11,15")
    transformer_lm_baevski_wiki103(args)


@register_model_architecture("clusterformer_lm", "clusterformer_lm_enwik8")
def clusterformer_lm_enwik8(args):
    """The paper's enwik8 model: 16 layers, 8 heads, 512 dims, byte vocabulary (tied input/output)."""
    set_defaults(
        args,
        decoder_layers=16,
        decoder_attention_heads=8,
        decoder_embed_dim=512,
        decoder_ffn_embed_dim=2048,
        dropout=0.3,
        attention_dropout=0.1,
        activation_dropout=0.1,
        decoder_normalize_before=True,
        share_decoder_input_output_embed=True,
    )
    _long_range_defaults(args, "11,15")
    base_lm_architecture(args)


@register_model_architecture("clusterformer_lm", "clusterformer_lm_tiny")
def clusterformer_lm_tiny(args):
    """For tests and the demo: 4 layers of 64 dims, long-range layers 2 and 4, 16 clusters, windows of 64."""
    set_defaults(
        args,
        decoder_layers=4,
        decoder_attention_heads=4,
        decoder_embed_dim=64,
        decoder_ffn_embed_dim=256,
        dropout=0.1,
        decoder_normalize_before=True,
        share_decoder_input_output_embed=True,
    )
    _long_range_defaults(args, "2,4", num_clusters=16, window=64, stride=32)
    base_lm_architecture(args)
