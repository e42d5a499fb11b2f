#!/usr/bin/env bash
# Train the paper's WikiText-103 language model (Cluster-Former, paper section 4.2) with fairseq-train.
set -euo pipefail
recipe=wikitext103 level=word default_data=data-bin/wikitext-103
about="Trains on DATA_BIN (default $default_data, made by prepare.sh). The paper preset is the paper's model,
clusterformer_lm_wiki103 (every preset's settings: docs/usage.md, 'The LM presets')."
# shellcheck source=../lm_recipe.sh
source "$(dirname "$0")/../lm_recipe.sh"
train_main "$@"
