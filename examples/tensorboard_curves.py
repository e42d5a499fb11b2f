"""Plot what fairseq-train's --tensorboard-logdir recorded: the loss, and the plug-in's own scalars beside it.

    python examples/tensorboard_curves.py LOGDIR --out curves.png

LOGDIR is the folder given to --tensorboard-logdir: fairseq writes one event file per stream into train_inner/
(every --log-interval updates), train/ (per epoch) and valid/. One panel per scalar the run recorded, of these: the
loss (train_inner and valid), the cluster entropy of every Cluster-Former layer in bits (cluster_entropy_N), the
K-Means refreshes so far (kmeans_refreshes), the states in each memory bank (bank_N), and for a QA run the
validation EM and F1 (em, f1). Prints the panels' last values, so that a run without a display can be read too.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# the panels, in order: (title, the scalars drawn in it, by tag pattern, and the streams they are read from)
PANELS = [
    ("loss (bits)", r"loss", ("train_inner", "valid")),
    ("cluster entropy (bits)", r"cluster_entropy_\d+", ("train_inner",)),
    ("K-Means refreshes", r"kmeans_refreshes", ("train_inner",)),
    ("memory bank fill (states)", r"bank_\d+", ("train_inner",)),
    ("validation EM / F1", r"em|f1", ("valid",)),
]


def read_scalars(logdir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{stream: {tag: [(update, value), ...]}} of every event file under ``logdir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    streams: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for folder in sorted(p for p in logdir.iterdir() if p.is_dir()):
        events = EventAccumulator(str(folder))
        events.Reload()
        streams[folder.name] = {
            tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
        }
    if not streams:
        sys.exit(f"{logdir}: no event folders (train_inner/, valid/, ...): give fairseq-train's --tensorboard-logdir")
    return streams


def plot(streams: dict, out: Path) -> list[str]:
    """Draw the panels the run has scalars for into ``out``; returns one line per curve with its last value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for title, pattern, names in PANELS:
        curves = [(f"{tag} ({name})", points) for name in names for tag, points in sorted(streams.get(name, {}).items())
                  if re.fullmatch(pattern, tag) and points]  # fmt: skip
        if curves:
            panels.append((title, curves))
    if not panels:
        sys.exit("the event files hold none of the plotted scalars (loss, cluster_entropy_N, kmeans_refreshes, ...)")
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    said = []
    for axis, (title, curves) in zip(axes[0], panels):
        for label, points in curves:
            steps, values = zip(*points)
            axis.plot(steps, values, marker="." if len(points) < 12 else None, label=label)
            said.append(f"{label}: {values[-1]:g} at update {steps[-1]}")
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("update")
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    return said


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logdir", type=Path, help="the folder fairseq-train's --tensorboard-logdir named")
    parser.add_argument("--out", type=Path, required=True, help="the picture to write (.png)")
    args = parser.parse_args(argv)
    if not args.logdir.is_dir():
        sys.exit(f"{args.logdir}: no such folder (fairseq-train's --tensorboard-logdir)")
    for line in plot(read_scalars(args.logdir), args.out):
        print(line)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
