"""Criterions of the Cluster-Former tasks (the language model uses fairseq's own cross-entropy / adaptive loss)."""
