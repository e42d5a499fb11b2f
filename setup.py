from setuptools import find_packages, setup

setup(
    name="fairseq_clusterformer",
    version="0.1.0",
    description="Cluster-Former (sliding-window + clustered attention) as a fairseq plug-in",
    packages=find_packages(include=["fairseq_clusterformer", "fairseq_clusterformer.*"]),
    python_requires=">=3.9",
    install_requires=[
        "torch>=2.0",
        # fairseq 0.12.2 does not run on Python 3.11 (mutable dataclass defaults); fairseq-fixed is a community
        # release of the same code base with that fixed, on hydra-core 1.3 / omegaconf 2.3.
        'fairseq==0.12.2; python_version < "3.11"',
        'fairseq-fixed==0.12.3.1; python_version >= "3.11"',
        # both fairseq packages still call np.compat.long, which numpy 2 removed
        "numpy<2",
        "faiss-cpu",
        "sentencepiece",
        "tensorboard",
        # Hugging Face imports (fairseq-clusterformer-import-hf) and their tokenisers
        "safetensors",
        "tokenizers",
    ],
    entry_points={
        "console_scripts": [
            "fairseq-clusterformer-inspect = fairseq_clusterformer.scripts.longrange.inspect_clusters:cli_main",
            "fairseq-clusterformer-causal-eval = fairseq_clusterformer.scripts.lm.causal_eval:cli_main",
            "fairseq-clusterformer-longrange = fairseq_clusterformer.scripts.longrange.longrange_eval:cli_main",
            "fairseq-clusterformer-recall-task = fairseq_clusterformer.scripts.longrange.recall_task:cli_main",
            "fairseq-clusterformer-qa-convert = fairseq_clusterformer.qa.scripts.convert:cli_main",
            "fairseq-clusterformer-qa-binarize = fairseq_clusterformer.qa.scripts.binarize:cli_main",
            "fairseq-clusterformer-qa-predict = fairseq_clusterformer.qa.scripts.predict:cli_main",
            "fairseq-clusterformer-qa-ask = fairseq_clusterformer.qa.scripts.ask:cli_main",
            "fairseq-clusterformer-qa-reach = fairseq_clusterformer.qa.scripts.reach:cli_main",
            "fairseq-clusterformer-train-spm = fairseq_clusterformer.qa.scripts.train_sentencepiece:cli_main",
            "fairseq-clusterformer-import-hf = fairseq_clusterformer.qa.scripts.import_hf:cli_main",
            "fairseq-clusterformer-export-hf = fairseq_clusterformer.qa.scripts.export_hf:cli_main",
        ],
    },
    extras_require={
        # transformers: the reference models of the Hugging Face import test
        "dev": ["pytest", "pytest-xdist", "hypothesis", "ruff==0.17.6", "matplotlib", "transformers"],
        # faiss-gpu >= 1.14.3 is the official facebookresearch wheel (CUDA 12, Python >= 3.10, numpy >= 1.25); the
        # older releases under that name (up to 1.7.2) are unofficial and stop at Python 3.10. It installs the same
        # `faiss` package as faiss-cpu: after `pip install -e ".[gpu]"` run
        # `pip uninstall -y faiss-cpu && pip install --force-reinstall --no-deps faiss-gpu`.
        "gpu": ["faiss-gpu>=1.14.3"],
        # fairseq-clusterformer-export-hf and loading its folders (docs/hf_export.md)
        "hf": ["transformers>=5.0"],
    },
)
