"""The presets (smoke / small / paper, per level), the rows of the paper's Table 3, and the fairseq command lines.

The one home of the presets' settings (what each is for, and their table: docs/usage.md, "The LM presets"): the
Table 3 comparison (benchmarks/lm_compare/compare.py) runs every row at a preset, and
examples/{wikitext103,enwik8}/{train,eval}.sh read their defaults from ``--shell``, so the two cannot drift apart.
Every row of a level runs the same scale (layers, dimensions, data, batches, updates); only the long-range layers'
kind, cluster count and causality differ, and none adds parameters (centroids and LSH rotations are buffers).

    python fairseq_clusterformer/scripts/lm/presets.py --preset small --level word --print-flags
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Row:
    key: str  # folder name and --rows selector
    label: str  # first column of the table
    kind: str  # --long-range-layer
    clusters: int  # --num-clusters: clusters, or LSH buckets; 0 = the kind has none
    causality: str  # --cluster-causality


def _long_range_rows(causality: str) -> list[Row]:
    return [
        Row(f"sparse-{causality}", f"Sparse attention, {causality}", "sparse", 0, causality),
        # the paper sets the LSH hashing vectors to 64, the same as Cluster-Former's smallest cluster count
        Row(f"lsh64-{causality}", f"LSH (64 buckets), {causality}", "lsh", 64, causality),
        *(
            Row(f"cluster{p}-{causality}", f"Cluster-Former (#C={p}), {causality}", "cluster", p, causality)
            for p in (64, 256, 512)
        ),
    ]


# strict rows first: if the long run is cut short, the default mode's table is the one that is complete
ROWS: tuple[Row, ...] = (
    Row("window", "Sliding window", "none", 0, "strict"),
    *_long_range_rows("strict"),
    *_long_range_rows("paper"),
)

# level -> (name in the table, metric)
LEVELS = {"word": ("Word level", "ppl"), "char": ("Character level", "bpc")}


@dataclass(frozen=True)
class Scale:
    arch: str
    layers: int
    long_range_layers: str
    embed_dim: int
    ffn_dim: int
    heads: int
    tokens: int  # --tokens-per-sample: segment length
    window: int
    stride: int
    batch: int  # segments per update
    updates: int
    optimizer: str  # "adam" or "sgd"
    lr: float
    warmup: int
    clip: float
    dropout: float
    memory_size: int
    refresh_interval: int  # --cluster-update-interval
    kmeans_iters: int
    clusters: int  # the recipes' --num-clusters unless CLUSTERS is set (the comparison's rows bring their own)
    log_interval: int
    context_window: int  # fairseq-eval-lm --context-window
    eval_max_tokens: int  # the recipes' fairseq-eval-lm --max-tokens: tokens per evaluation batch
    criterion: str = "cross_entropy"
    model_dims: bool = True  # pass the dimensions explicitly (False: the named architecture's own)


# seconds per row: a few updates of a 4-layer, 32-dim model; the K-Means job started at update 2 installs at 5
SMOKE = Scale(
    arch="clusterformer_lm",
    layers=4,
    long_range_layers="2,4",
    embed_dim=32,
    ffn_dim=64,
    heads=2,
    tokens=128,
    window=32,
    stride=16,
    batch=2,
    updates=6,
    optimizer="adam",
    lr=0.003,
    warmup=2,
    clip=0.5,
    dropout=0.0,
    memory_size=2000,
    refresh_interval=2,
    kmeans_iters=5,
    clusters=16,
    log_interval=50,
    context_window=64,
    eval_max_tokens=512,
)

# 6 layers, long-range layers 4 and 6, segments of many windows: the five sliding-window layers below layer 6 reach
# at most 5 * (window - 1) tokens back, so most of a segment is reachable only through the long-range layers
SMALL = replace(
    SMOKE,
    layers=6,
    long_range_layers="4,6",
    embed_dim=128,
    ffn_dim=256,
    heads=4,
    tokens=1024,
    window=64,
    stride=32,
    batch=2,
    updates=300,
    lr=0.002,
    warmup=100,
    dropout=0.1,
    memory_size=20_000,
    refresh_interval=50,
    kmeans_iters=10,
    clusters=64,
    context_window=512,
    eval_max_tokens=4096,
)

# paper section 4.2: 16 layers, 8 heads, long-range layers 11 and 15, 3,072-token segments, window 256, stride 128,
# SGD, lr 0.1, clip 0.1, warm-up 16,000, 286,000 updates, dropout 0.3, batch 16 (the named architectures' dims)
PAPER = replace(
    SMOKE,
    arch="clusterformer_lm_wiki103",
    layers=16,
    long_range_layers="11,15",
    embed_dim=1024,
    ffn_dim=4096,
    heads=8,
    tokens=3072,
    window=256,
    stride=128,
    batch=16,
    updates=286_000,
    optimizer="sgd",
    lr=0.1,
    warmup=16_000,
    clip=0.1,
    dropout=0.3,
    memory_size=100_000,
    refresh_interval=2000,
    kmeans_iters=20,
    clusters=512,
    log_interval=100,
    context_window=2560,
    eval_max_tokens=3072,
    criterion="adaptive_loss",
    model_dims=False,
)


# character level: twice the bytes per segment at small scale; the paper's enwik8 model is 512 dims wide, tied
CHAR_SMALL = replace(SMALL, tokens=2048, window=128, stride=64, context_window=1024, eval_max_tokens=8192)
CHAR_PAPER = replace(PAPER, arch="clusterformer_lm_enwik8", embed_dim=512, ffn_dim=2048, criterion="cross_entropy")
PRESETS: dict[str, dict[str, Scale]] = {
    "smoke": {"word": SMOKE, "char": SMOKE},
    "small": {"word": SMALL, "char": CHAR_SMALL},
    "paper": {"word": PAPER, "char": CHAR_PAPER},
}
# old name -> new name: "tiny" was also the 64-dim architecture clusterformer_lm_tiny, a different model
RENAMED = {"tiny": "smoke"}


def preset_name(name: str) -> str:
    """--preset's argparse type: a renamed preset's old name still runs, as its new name, with a note on stderr."""
    if name in RENAMED:
        print(f"--preset {name} was renamed --preset {RENAMED[name]}: running that", file=sys.stderr)
        return RENAMED[name]
    return name


def flags(**values: object) -> list[str]:
    """flags(max_update=5, no_epoch_checkpoints=True) -> ["--max-update", "5", "--no-epoch-checkpoints"]."""
    args: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


def setting_flags(row: Row, scale: Scale) -> list[str]:
    """The preset's task, model and schedule as fairseq-train flags: what the comparison and the recipes both run."""
    args = flags(task="clusterformer_lm", arch=scale.arch)
    if scale.model_dims:
        args += flags(
            decoder_layers=scale.layers,
            decoder_embed_dim=scale.embed_dim,
            decoder_ffn_embed_dim=scale.ffn_dim,
            decoder_attention_heads=scale.heads,
            decoder_normalize_before=True,
            share_decoder_input_output_embed=True,
        )
    args += flags(
        long_range_layers=scale.long_range_layers,
        long_range_layer=row.kind,
        cluster_causality=row.causality,
        window_size=scale.window,
        window_stride=scale.stride,
        tokens_per_sample=scale.tokens,
        sample_break_mode="none",
        batch_size=scale.batch,
        max_update=scale.updates,
        dropout=scale.dropout,
        criterion=scale.criterion,
        optimizer=scale.optimizer,
        lr=scale.lr,
        clip_norm=scale.clip,
        lr_scheduler="inverse_sqrt",
        warmup_updates=scale.warmup,
        warmup_init_lr="1e-07",
        memory_size=scale.memory_size,
        cluster_update_interval=scale.refresh_interval,
        kmeans_iters=scale.kmeans_iters,
    )
    if row.clusters:
        args += flags(num_clusters=row.clusters)
    if scale.optimizer == "adam":
        args += flags(adam_betas="(0.9, 0.98)")
    return args


def train_args(row: Row, scale: Scale, data_bin: Path, save_dir: Path, user_dir: Path, seed: int = 1) -> list[str]:
    """fairseq-train's arguments for one row of the comparison (after the program name)."""
    return [
        str(data_bin),
        *flags(user_dir=user_dir),
        *setting_flags(row, scale),
        *flags(
            # validate and save once, at the end: every row is scored after the same number of updates
            validate_interval=1_000_000,
            save_interval=1_000_000,
            no_epoch_checkpoints=True,
            save_dir=save_dir,
            num_workers=0,
            log_format="simple",
            log_interval=scale.log_interval,
            seed=seed,
        ),
    ]


def eval_args(scale: Scale, data_bin: Path, checkpoint: Path, user_dir: Path) -> list[str]:
    """fairseq-eval-lm's arguments: the test split, in segments of the training length with a context window."""
    return [
        str(data_bin),
        *flags(
            user_dir=user_dir,
            path=checkpoint,
            gen_subset="test",
            tokens_per_sample=scale.tokens,
            context_window=scale.context_window,
            batch_size=scale.batch,
            num_workers=0,
            softmax_batch=1024,
        ),
    ]


def recipe_row(scale: Scale, kind: str = "cluster", clusters: int | None = None, causality: str = "strict") -> Row:
    """The one row a recipe trains: by default Cluster-Former with the preset's cluster count, strictly causal."""
    count = scale.clusters if clusters is None else clusters
    return Row("recipe", f"{kind}, {count} clusters, {causality}", kind, count, causality)


def shell_assignments(scale: Scale) -> list[str]:
    """preset_<setting>=<value> for every setting, quoted for bash's eval; True / False as 1 / 0."""
    return [
        f"preset_{name}={shlex.quote(str(int(value) if isinstance(value, bool) else value))}"
        for name, value in asdict(scale).items()
    ]


def cli_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The LM presets' settings, as fairseq-train flags or shell lines.")
    parser.add_argument("--preset", type=preset_name, choices=sorted(PRESETS), required=True)
    parser.add_argument("--level", choices=sorted(LEVELS), required=True, help="word (WikiText) or char (enwik8)")
    # no list of kinds here (this file runs without torch for the recipes): fairseq-train's flag refuses a bad one
    parser.add_argument("--kind", default="cluster", help="--long-range-layer (layers/kinds.py)")
    parser.add_argument("--clusters", type=int, help="clusters or LSH buckets (default: the preset's)")
    parser.add_argument("--causality", choices=("strict", "paper"), default="strict")
    output = parser.add_mutually_exclusive_group(required=True)
    output.add_argument("--print-flags", action="store_true", help="fairseq-train's flags, one token per line")
    output.add_argument("--shell", action="store_true", help="preset_<setting>=<value> lines, read by the recipes")
    args = parser.parse_args(argv)
    scale = PRESETS[args.preset][args.level]
    if args.shell:  # preset_name: the preset's current name, for the recipes' checkpoint folders
        lines = [f"preset_name={args.preset}", *shell_assignments(scale)]
    else:
        lines = setting_flags(recipe_row(scale, args.kind, args.clusters, args.causality), scale)
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
