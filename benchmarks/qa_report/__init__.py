"""The QA experiments' reports: table b with its paired bootstrap and mechanism tables, and the trivial span
baselines scored beside a run's predictions."""
