"""QA data: the JSONL record format, tokenisers, the binarised format and the official prediction formats.

The interface between the converters, the binariser and the QA task is written down in ``records.py`` (stage 1,
one JSON record per line) and ``binarized.py`` (stage 2, fairseq indexed datasets plus a meta JSONL).
"""
