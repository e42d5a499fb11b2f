"""The layer kinds: sliding-window layers and the long-range layers (Cluster-Former, LSH, sparse), built on ``ops``.

``settings`` holds the settings every layer is built from and the rules they follow; ``kinds`` is the registry of
long-range kinds and a model's ``LongRangePlan``; ``build`` picks a layer's kind from that plan.
"""
