"""The measurements and experiment reports of the repository, run from its root as ``python -m benchmarks.NAME``
(README.md beside this file lists them). Not part of the installed package."""
