#!/usr/bin/env bash
# Score a trained enwik8 model with fairseq-eval-lm; the last line printed is the bits per character.
set -euo pipefail
recipe=enwik8 level=char default_data=data-bin/enwik8 metric=bpc
about="Scores a model trained by examples/enwik8/train.sh (give the same --preset). One token is one byte, so
fairseq's loss in base 2 per token is the bits per character."
# shellcheck source=../lm_recipe.sh
source "$(dirname "$0")/../lm_recipe.sh"
eval_main "$@"
