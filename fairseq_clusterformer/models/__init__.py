from fairseq_clusterformer.models import clusterformer_lm  # noqa: F401
