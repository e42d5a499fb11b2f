"""`make gpu-check`: validate and measure the plug-in on one CUDA GPU in one command (tiny sizes on a CPU).

Run as ``python -m benchmarks.gpu_check --out DIR``; ``__main__`` is the driver, each ``part_*`` module one part.
"""
