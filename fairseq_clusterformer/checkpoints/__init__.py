"""Checkpoint files: their integrity (zip records and CRC-32), the files a run loads, whether a checkpoint fits the
model the flags build, the training dictionary recorded in the weights, writes a kill cannot leave half done, and
what checkpoints of earlier versions need to load (``old_layouts``).
Nothing here imports the models: the model classes are asked through what they expose (``computing_settings``)."""
