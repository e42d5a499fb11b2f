"""Language-model scripts: the presets of the recipes and the Table 3 comparison, the enwik8 splitter, and the causal
re-scoring that measures paper mode's leak.
"""
