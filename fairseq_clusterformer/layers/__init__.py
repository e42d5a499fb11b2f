"""The layer kinds: sliding-window layers and the long-range layers (Cluster-Former, LSH, sparse), built on ``ops``.

``settings`` holds the settings every layer is built from and the one place they are checked; ``build`` picks a
layer's kind from a model's ``LongRangePlan``.
"""
