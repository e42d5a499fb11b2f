#!/usr/bin/env bash
# Score a trained WikiText-103 model with fairseq-eval-lm; the last line printed is the perplexity.
set -euo pipefail
recipe=wikitext103 level=word default_data=data-bin/wikitext-103 metric=perplexity
about="Scores a model trained by examples/wikitext103/train.sh (give the same --preset)."
# shellcheck source=../lm_recipe.sh
source "$(dirname "$0")/../lm_recipe.sh"
eval_main "$@"
