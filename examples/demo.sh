#!/usr/bin/env bash
# Train a tiny Cluster-Former language model on the committed WikiText-2 slice and print the perplexity that
# fairseq-eval-lm reports on the slice's test text. A few minutes on 2 CPU cores. Run it as `make demo` (which
# builds the environment first) or, inside an environment with the package installed, as `bash examples/demo.sh`.
#
# Environment overrides: WORK (scratch folder, default demo-work/: a new or empty folder, or one this script made
# before, whose checkpoints it then replaces), UPDATES (at least 1, default 200), CAUSALITY (strict|paper),
# LONG_RANGE (cluster|none).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
# shellcheck source=recipe_args.sh
source "$here/recipe_args.sh"
recipe_env int UPDATES
text="$here/data/wikitext-2-slice"
work="${WORK:-$repo/demo-work}"
updates="${UPDATES:-200}"
# fairseq reads --max-update 0 as "no limit": it would train on and on
((updates > 0)) || recipe_die "UPDATES=$updates: expected at least 1 update"
# a log line every 50 updates, or at the last update of a shorter run (else there is no line to show)
log_interval=$((updates < 50 ? updates : 50))
recipe_own_dir WORK "$work"
causality="${CAUSALITY:-strict}"
long_range="${LONG_RANGE:-cluster}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

recipe_claim_dir "$work"
if [ ! -f "$work/data-bin/dict.txt" ]; then
  fairseq-preprocess --only-source --trainpref "$text/train.txt" --validpref "$text/valid.txt" \
    --testpref "$text/test.txt" --destdir "$work/data-bin" --workers 2 > "$work/preprocess.log" 2>&1
fi

rm -rf "$work/checkpoints"
echo "training clusterformer_lm_tiny ($long_range, $causality causality) for $updates updates; log: $work/train.log"
fairseq-train "$work/data-bin" --user-dir "$repo/fairseq_clusterformer" \
  --task clusterformer_lm --arch clusterformer_lm_tiny \
  --long-range-layer "$long_range" --cluster-causality "$causality" \
  --tokens-per-sample 512 --sample-break-mode none --batch-size 8 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.003 --lr-scheduler inverse_sqrt --warmup-updates 50 \
  --clip-norm 0.5 --max-update "$updates" \
  --memory-size 20000 --cluster-update-interval 50 --kmeans-iters 20 \
  --save-dir "$work/checkpoints" --no-epoch-checkpoints --num-workers 0 \
  --log-format simple --log-interval "$log_interval" --seed 1 > "$work/train.log" 2>&1 \
  || { tail -n 30 "$work/train.log"; exit 1; }
# every log interval: training loss, cluster-size entropy (bits; log2 16 = 4 is uniform), K-Means refreshes so far
grep -E "train_inner" "$work/train.log" | sed -E 's/^.*(epoch [0-9]+).*cluster_entropy_0=([0-9.]+).*cluster_entropy_1=([0-9.]+).*kmeans_refreshes=([0-9]+), loss=([0-9.]+).*num_updates=([0-9]+).*/update \6: train loss \5 (base 2), cluster entropy \2 \3 bits, K-Means refreshes \4/' ||
  echo "(no training line in $work/train.log)"
grep -E "valid on" "$work/train.log" | tail -n 1 | sed -E 's/^.*valid on .valid. subset \| /last validation: /' | cut -c1-120 ||
  echo "(no validation line in $work/train.log)"

echo "evaluating checkpoint_best.pt on the test text with fairseq-eval-lm --context-window 256"
fairseq-eval-lm "$work/data-bin" --user-dir "$repo/fairseq_clusterformer" \
  --path "$work/checkpoints/checkpoint_best.pt" --gen-subset test \
  --tokens-per-sample 512 --context-window 256 --batch-size 8 --num-workers 0 > "$work/eval.log" 2>&1 \
  || { tail -n 30 "$work/eval.log"; exit 1; }
grep -E "Evaluated|Perplexity" "$work/eval.log" | sed -E 's/^.*fairseq_cli.eval_lm( \||:) ?//'
