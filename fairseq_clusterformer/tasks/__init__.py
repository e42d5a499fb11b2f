from fairseq_clusterformer.tasks import clusterformer_lm  # noqa: F401
