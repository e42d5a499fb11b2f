"""The Cluster-Former language model: its decoder, the registered ``clusterformer_lm`` model and architectures, and
the ``clusterformer_lm`` task."""

from fairseq_clusterformer.lm import model, task  # noqa: F401  (registers them with fairseq)
