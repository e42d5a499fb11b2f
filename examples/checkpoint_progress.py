"""How far a fairseq run got: print the updates and the training hours saved in a checkpoint ("0 0" when the file
does not exist), for the recipes that resume runs (examples/code/compare.sh, examples/qa/cpu_pretrained.sh).

    python examples/checkpoint_progress.py SAVE_DIR/checkpoint_last.pt   ->   "2500 0.61"

The hours matter because fairseq's --stop-time-hours counts those of earlier runs too."""

import sys
from pathlib import Path

import torch


def main(path: Path) -> None:
    if not path.is_file():
        print(0, 0)
        return
    state = torch.load(path, map_location="cpu", weights_only=False)
    seconds = state.get("extra_state", {}).get("previous_training_time", 0)
    print(state["optimizer_history"][-1]["num_updates"], round(seconds / 3600, 6))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
