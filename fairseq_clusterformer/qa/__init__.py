"""Long-context question answering: the ``clusterformer_qa`` model (a RoBERTa encoder on windows), task and
criterion, with their data pipeline (``data``, ``formats``), pure span and metric functions (``ops``), the Hugging
Face import (``hf``) and the QA console scripts (``scripts``). The package's ``__init__`` registers the model, task
and criterion; importing a part of ``qa`` (its data or ops) loads no model code."""
