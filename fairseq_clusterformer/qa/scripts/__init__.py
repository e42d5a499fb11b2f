"""QA console scripts: converters of the published formats, the binariser and its sentencepiece trainer, the Hugging
Face import and export, the predictor, the question asker and the reach analysis."""
