"""QA data: the JSONL record format, tokenisers, the binarised format and the official prediction formats.

The interface between the converters, the binariser and the QA task is written down in ``qa_records.py`` (stage 1,
one JSON record per line) and ``qa_binarized.py`` (stage 2, fairseq indexed datasets plus a meta JSONL).
"""
