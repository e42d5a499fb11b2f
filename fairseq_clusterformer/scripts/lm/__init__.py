"""Language-model comparison: the Table 3 driver with its presets and data, the enwik8 splitter, and the causal
re-scoring that measures paper mode's leak.
"""
