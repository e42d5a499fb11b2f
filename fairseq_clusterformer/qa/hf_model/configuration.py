"""The configuration of an exported clusterformer_qa model (``config.json``), and the fairseq model arguments it
stands for.

The fields a reader looks for have transformers' names (``hidden_size``, ``max_position_embeddings``, ...) or the
layer flags' names (``window_size``, ``long_range_layers``, ...); they are the only record of what they name. Every
other fairseq model argument the checkpoint was built with is kept as it was in ``fairseq_args``, so that the model
is rebuilt exactly as ``fairseq-train`` built it. Token ids are the exported tokenizer's (Hugging Face ids), not
fairseq's dictionary indices: ``hf_to_fairseq`` in the weights maps one to the other.
"""

from __future__ import annotations

import argparse
from typing import Any

import transformers
from packaging.version import Version
from transformers import PretrainedConfig

# the oldest transformers this has been tested with: its configs are dataclasses (the fields below), its models are
# built on the meta device unless ``get_init_context`` says otherwise, and a model folder may bring its own pipeline
OLDEST_TRANSFORMERS = "5.0.0"


def check_transformers(version: str = transformers.__version__) -> None:
    """ImportError naming the installed transformers when it is older than OLDEST_TRANSFORMERS."""
    if Version(version) < Version(OLDEST_TRANSFORMERS):
        raise ImportError(
            f"transformers {version} is installed; an exported clusterformer_qa model needs transformers >= "
            f"{OLDEST_TRANSFORMERS} (dataclass configs, models built off the meta device on request, a model folder's "
            f"own question-answering pipeline): pip install 'transformers>={OLDEST_TRANSFORMERS}'"
        )


check_transformers()

# config.json field -> the fairseq model argument it is
NAMED_ARGS = {
    "hidden_size": "encoder_embed_dim",
    "num_hidden_layers": "encoder_layers",
    "num_attention_heads": "encoder_attention_heads",
    "intermediate_size": "encoder_ffn_embed_dim",
    "hidden_act": "activation_fn",
    "layer_norm_eps": "layer_norm_eps",
    "type_vocab_size": "type_vocab_size",
    "max_position_embeddings": "max_positions",
    "window_size": "window_size",
    "window_stride": "window_stride",
    "long_range_layers": "long_range_layers",
    "long_range_layer": "long_range_layer",
    "long_range_mode": "long_range_mode",
    "num_clusters": "num_clusters",
    "window_merge": "window_merge",
}
# how the exported model computes, whatever the training run used: eager layers (a compiled graph is the caller's
# choice), no pretrained encoder to read (the weights hold it)
INFERENCE_ARGS = {"compile_layers": "off", "attention_backend": "eager", "roberta_path": None, "roberta_dict": None}


class ClusterFormerQAHFConfig(PretrainedConfig):
    model_type = "clusterformer_qa"

    vocab_size: int = 0  # the exported tokenizer's ids, the paragraph token's included
    fairseq_vocab_size: int = 0  # rows of the token embedding (the training dictionary)
    hidden_size: int = 0
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    intermediate_size: int = 0
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    type_vocab_size: int = 0
    max_position_embeddings: int = 0  # positions of one window: <s> question </s></s> context window
    window_size: int = 0
    window_stride: int = 0
    long_range_layers: str = ""
    long_range_layer: str = "none"
    long_range_mode: str = "replace"
    num_clusters: int = 0
    window_merge: str = "layer"
    max_question_tokens: int = 0
    max_context_tokens: int = 0  # the longest context the model was set to read (--max-context-eval), <p> included
    max_answer_tokens: int = 30
    answer_types: bool = False
    bos_token_id: int = 0  # <s> / [CLS]
    pad_token_id: int = 1  # <pad> / [PAD]
    eos_token_id: int = 2  # </s> / [SEP]
    paragraph_token_id: int = -1  # <p>: one past the tokenizer's own ids (text never tokenises to it)
    fairseq_args: dict | None = None
    exported_from: dict | None = None  # the checkpoint (path, sha256), its data folder and training record

    def fairseq_namespace(self) -> argparse.Namespace:
        """The fairseq model arguments: ``fairseq_args`` under the named fields and the inference settings."""
        args: dict[str, Any] = dict(self.fairseq_args or {})
        args.update({arg: getattr(self, field) for field, arg in NAMED_ARGS.items()})
        args.update(INFERENCE_ARGS)
        return argparse.Namespace(**args)
