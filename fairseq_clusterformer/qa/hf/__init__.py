"""The Hugging Face import: a BERT- or RoBERTa-family encoder's weights (``weights``) and tokenizer (``vocab``) as a
fairseq RoBERTa checkpoint and dictionary for ``--roberta-path``."""
