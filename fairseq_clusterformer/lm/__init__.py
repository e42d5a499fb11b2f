"""The Cluster-Former language model: its decoder, the registered ``clusterformer_lm`` model and architectures, and
the ``clusterformer_lm`` task (registered by the package's ``__init__``)."""
