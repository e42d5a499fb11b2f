"""Pure tensor functions of Cluster-Former. Nothing here imports fairseq."""
