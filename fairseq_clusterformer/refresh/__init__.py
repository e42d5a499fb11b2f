"""The K-Means refresh of the centroids (paper Algorithm 1): the memory banks that training fills, the refresher
that snapshots them and installs new centroids, the K-Means job, the exchange between ranks, and the task hooks
that drive it from fairseq."""
