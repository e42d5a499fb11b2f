"""Pure tensor functions of the QA model: question + context windows, span scoring and decoding, the official
metrics. Nothing here imports fairseq."""
