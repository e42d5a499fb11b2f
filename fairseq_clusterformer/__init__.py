"""Cluster-Former for fairseq: load with ``--user-dir fairseq_clusterformer`` (or ``import fairseq_clusterformer``).

fairseq's --user-dir loader imports models/ and tasks/ by itself but not criterions/, so the package
imports all three: a plain ``import fairseq_clusterformer`` registers everything too.
"""

from fairseq_clusterformer.fairseq_compat import restore_official_batching

# before any dataset is batched: fairseq-fixed would silently drop the last batch of every split
restore_official_batching()

from fairseq_clusterformer import criterions, models, tasks  # noqa: E402, F401
