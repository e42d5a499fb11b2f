"""Console scripts: data preparation and inspection tools (entry points in setup.py)."""
