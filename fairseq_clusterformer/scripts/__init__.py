"""Console scripts of the language model and the long-range analysis (the QA ones are in ``qa/scripts``), and the
helpers every console script shares; entry points in setup.py."""
