"""``fairseq-train`` with PyTorch's deterministic kernels, for the resume check of the train part.

On a GPU two uninterrupted runs of the same command differ in their last bits (atomic adds in the backward of
embeddings, gathers, scatters and fused attention sum in a varying order), and after 40 updates those bits have grown
to 1e-3 in the weights: a stopped-and-resumed run can be compared bit for bit with an uninterrupted one only when both
take deterministic kernels. So this runs ``fairseq-train`` under ``torch.use_deterministic_algorithms(True,
warn_only=True)`` and with ``scaled_dot_product_attention`` on its math backend: the cuDNN, flash and memory-efficient
backends' backward passes are not deterministic (on an H100 cuDNN's is taken and only warns, "cuDNN Attention defaults
to a non-deterministic algorithm"). ``warn_only`` keeps any other op without such a kernel running, with a
UserWarning naming it, which the train part reports. cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` when it starts; the
train part sets it.

    python benchmarks/gpu_check/deterministic_train.py DATA [fairseq-train options]
"""

import sys

import torch
from fairseq_cli.train import cli_main

if __name__ == "__main__":
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    sys.argv[0] = "fairseq-train"
    cli_main()
