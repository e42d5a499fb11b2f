"""Criterions of the Cluster-Former tasks (the language model uses fairseq's own cross-entropy / adaptive loss)."""

from fairseq_clusterformer.criterions import clusterformer_qa  # noqa: F401
