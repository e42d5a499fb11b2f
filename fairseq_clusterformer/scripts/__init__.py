"""Console scripts, one sub-package per job (qa, lm, longrange); entry points in setup.py."""
