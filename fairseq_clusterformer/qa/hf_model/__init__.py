"""A trained clusterformer_qa model in Hugging Face transformers' hands (``fairseq-clusterformer-export-hf``): its
configuration, a ``PreTrainedModel`` for question answering that runs the package's own encoder, and the
question-answering pipeline that reads a whole document as ``qa-ask`` does (docs/hf_export.md)."""
