"""Long-context question answering: the ``clusterformer_qa`` model (a RoBERTa encoder on windows), task and
criterion, with their data pipeline (``data``, ``formats``), pure span and metric functions (``ops``), the Hugging
Face import (``hf``) and the QA console scripts (``scripts``)."""

from fairseq_clusterformer.qa import criterion, model, task  # noqa: F401  (registers them with fairseq)
