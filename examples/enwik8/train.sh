#!/usr/bin/env bash
# Train the paper's enwik8 character-level model (Cluster-Former, paper section 4.2) with fairseq-train.
set -euo pipefail
recipe=enwik8 level=char default_data=data-bin/enwik8
about="Trains on DATA_BIN (default $default_data, made by prepare.sh). The paper preset is the paper's model,
clusterformer_lm_enwik8 (every preset's settings: docs/usage.md, 'The LM presets')."
# shellcheck source=../lm_recipe.sh
source "$(dirname "$0")/../lm_recipe.sh"
train_main "$@"
