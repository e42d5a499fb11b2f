from fairseq_clusterformer.models import clusterformer_lm, clusterformer_qa  # noqa: F401
