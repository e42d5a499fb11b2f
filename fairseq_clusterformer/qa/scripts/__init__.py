"""QA console scripts: converters of the published formats, the binariser and its sentencepiece trainer, masked-LM
pretraining text, the Hugging Face import, the predictor, the reach analysis and the trivial baselines."""
