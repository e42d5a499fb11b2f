#!/usr/bin/env bash
# Train the paper's WikiText-103 language model (Cluster-Former, paper section 4.2) with fairseq-train.
set -euo pipefail
recipe=wikitext103 level=word default_data=data-bin/wikitext-103
about="Trains on DATA_BIN (default $default_data, made by prepare.sh). The paper preset is the paper's model,
clusterformer_lm_wiki103: 16 layers of 1,024 dims, adaptive input and softmax, long-range layers 11 and 15."
# shellcheck source=../lm_recipe.sh
source "$(dirname "$0")/../lm_recipe.sh"
train_main "$@"
