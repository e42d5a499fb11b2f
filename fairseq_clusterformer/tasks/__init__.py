from fairseq_clusterformer.tasks import clusterformer_lm, clusterformer_qa  # noqa: F401
