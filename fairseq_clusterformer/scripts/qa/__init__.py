"""QA data and model set-up: converters of the published formats, the binariser and its sentencepiece
trainer, masked-LM pretraining text, the Hugging Face encoder import, the predictor and the trivial baselines.
"""
