"""Long-range analysis: what the clusters hold (inspection), the loss by distance to a token's earlier
occurrence, and the synthetic recall task.
"""
