"""Would one more K-Means refresh move a trained checkpoint's centroids? The refresh training would run next, run on
the memory banks the checkpoint saved, and how far it moves each Cluster-Former layer's installed centroids.

    python -m benchmarks.centroid_shift RUN/checkpoint_last.pt [--json shift.json]

Only checkpoint_last.pt carries the memory banks (fairseq's task state; the other checkpoints leave them out). Per
Cluster-Former layer it takes the installed centroids (the model's ``...centroids`` buffers, in the order of the
layers) and the bank's states, oldest first, as a refresh's snapshot would, and runs the training's own refresh
(``refresh/kmeans_job.refresh_layer``: spherical K-Means with the run's --kmeans-iters and --kmeans-backend, seeded
as the next refresh would be, --seed plus the refreshes started). It prints what that refresh would log
(``ops/centroid_shift.py``): each new centroid's cosine with the nearest installed one, and the adjusted Rand index of
the banked states' clusters under the installed and the new centroids. Near 1: the clusters have settled, and more
refreshes would change little; well below 1: they were still moving when training stopped. The banks hold the
states of the last updates only (50,000 states are about 6 updates of 8 whole-article questions), so this says how
the clusters of the end of training differ from the installed ones, which were fit to an earlier bank. Beside it,
K-Means' own spread: the same bank fit once more with the following seed, against the first fit; a shift no larger
than that is the clustering's noise, not movement.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from fairseq_clusterformer.refresh.kmeans_job import refresh_layer
from fairseq_clusterformer.refresh.memory_bank import MemoryBank


def fail(why: str) -> None:
    print(f"centroid_shift.py: {why}", file=sys.stderr)
    sys.exit(2)


def refresh_state(checkpoint: dict, path: Path) -> dict:
    """The refresher's saved state (``CentroidRefresher.state_dict``), wherever the task filed it."""
    states = [v["centroid_refresh"] for v in checkpoint.get("extra_state", {}).values()
              if isinstance(v, dict) and "centroid_refresh" in v]  # fmt: skip
    if not states or "banks" not in states[0]:
        fail(f"{path} holds no memory banks: only checkpoint_last.pt of a run with Cluster-Former layers has them")
    return states[0]


def shifts(path: Path) -> dict:
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    state = refresh_state(checkpoint, path)
    model = checkpoint["model"]
    names = [key[: -len(".centroids")] for key in model if key.endswith(".centroids")]  # in the order of the layers
    if not names:
        fail(f"{path} has no Cluster-Former layer (no centroids to refresh)")
    if len(names) != len(state["banks"]):
        fail(f"{path}: {len(names)} layers with centroids but {len(state['banks'])} memory banks")
    task = checkpoint["cfg"]["task"]
    seed = task["seed"] + state["refreshes_started"]  # what the next refresh would be seeded with
    layers = []
    for name, saved in zip(names, state["banks"]):
        bank = MemoryBank(saved["capacity"])
        bank.load_state_dict(saved)
        installed = model[f"{name}.centroids"].float()  # P x C
        banked = bank.contents()  # N x C, oldest first, as a refresh's snapshot
        result = refresh_layer(banked, installed.size(0), task["kmeans_iters"], seed, task["kmeans_backend"],
                               previous=installed)  # fmt: skip
        if result.centroids is None:
            fail(f"{path}, {name}: the next refresh would be skipped ({result.skipped_because})")
        # K-Means' own spread: the same bank fit again with the following seed, against the first fit. Many clusters
        # on states without sharp clusters differ from seed to seed, so a shift is read against this floor
        again = refresh_layer(banked, installed.size(0), task["kmeans_iters"], seed + 1,
                              task["kmeans_backend"], previous=result.centroids)  # fmt: skip
        layers.append({
            "layer": name,
            "refreshes": int(model[f"{name}.refreshes"]),
            "banked_states": result.num_states,
            "nearest_cosine": result.nearest_cosine,
            "agreement": result.agreement,
            "reseeded_nearest_cosine": again.nearest_cosine,
            "reseeded_agreement": again.agreement,
        })  # fmt: skip
    return {"checkpoint": str(path), "kmeans_seed": seed, "backend": result.backend, "layers": layers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a run's checkpoint_last.pt")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if not args.checkpoint.is_file():
        fail(f"{args.checkpoint} not found")
    report = shifts(args.checkpoint)
    print(
        "| layer | refreshes installed | banked states | next refresh against the installed centroids: nearest cosine"
        " / adjusted Rand | the same bank fit with the following seed: nearest cosine / adjusted Rand |"
    )
    print("| --- | --- | --- | --- | --- |")
    for row in report["layers"]:
        moved = f"{row['nearest_cosine']:.3f} / {row['agreement']:.3f}"
        floor = f"{row['reseeded_nearest_cosine']:.3f} / {row['reseeded_agreement']:.3f}"
        print(f"| {row['layer']} | {row['refreshes']} | {row['banked_states']} | {moved} | {floor} |")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
