#!/usr/bin/env bash
# The long-range comparison on the source-code corpus of prepare.sh: train each RUN with examples/longrange/train.sh
# at this corpus's settings, score it, and write the report (table and plot).
#
#   bash examples/code/compare.sh [--work DIR] [RUN ...]
#   RUN: KIND-sSEED, KIND one of full none cluster-strict cluster-strict-next cluster-paper lsh sparse
#        (default: every kind with seeds 1 and 2, 14 runs of about 40 minutes each on one core)
#   --work DIR: prepare.sh's --out (default code-work): reads DIR/data-bin, writes DIR/ckpt/RUN (checkpoints),
#        DIR/logs/RUN.{train,score,causal}.log, DIR/results/code/RUN.json, DIR/causal/RUN.json (cluster-paper)
#        and DIR/report/ (results.md, the plot)
#
# A run already trained to UPDATES is not trained again, and one stopped on the way resumes from its
# checkpoint_last.pt; a run already scored is not scored again. Every run is scored on the whole test split by
# fairseq-clusterformer-longrange (loss by distance to each token's previous occurrence, with the mechanism
# statistic); cluster-paper, whose clusters let later tokens into a block's windows, is also scored token by token
# from its own prefix by fairseq-clusterformer-causal-eval on the first CAUSAL_BLOCKS blocks (default 4).
# Environment: the model and schedule of examples/code/README.md, each overridable as in train.sh: WINDOW (64),
# TOKENS (1024), BATCH (4), CLUSTERS (64), LAYERS (3,4), UPDATES (2500), THREADS (1); two runs side by side use
# both cores of a 2-core machine. PRECISION (fp32 | bf16: training under --autocast-bf16, docs/cpu_speed.md; scoring
# stays float32; give such runs their own --work, since a run's name does not say its precision).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work=code-work
# shellcheck source=../recipe_args.sh
source "$repo/examples/recipe_args.sh"
recipe_flag --work work DIR
recipe_parse "$@"
recipe_env int WINDOW TOKENS BATCH CLUSTERS UPDATES THREADS CAUSAL_BLOCKS
case "${PRECISION:-fp32}" in
  fp32) precision=() ;;
  bf16) precision=(--autocast-bf16) ;;
  *) echo "compare.sh: PRECISION=$PRECISION: expected fp32 or bf16" >&2; exit 2 ;;
esac
runs=(${RECIPE_ARGS[@]+"${RECIPE_ARGS[@]}"})
if [ ${#runs[@]} -eq 0 ]; then
  for kind in full none cluster-strict cluster-strict-next cluster-paper lsh sparse; do runs+=("$kind-s1" "$kind-s2"); done
fi
export WINDOW=${WINDOW:-64} TOKENS=${TOKENS:-1024} BATCH=${BATCH:-4} CLUSTERS=${CLUSTERS:-64} LAYERS=${LAYERS:-3,4}
export UPDATES=${UPDATES:-2500} OMP_NUM_THREADS=${THREADS:-1}
data=$work/data-bin
[ -f "$data/dict.txt" ] || { echo "compare.sh: $data/dict.txt not found: run examples/code/prepare.sh --out $work first" >&2; exit 2; }
trained=()  # updates each run has done; a bad name or a checkpoint that cannot be read stops before any run starts
for run in "${runs[@]}"; do
  [[ $run =~ ^(full|none|cluster-strict|cluster-strict-next|cluster-paper|lsh|sparse)-s[0-9]+$ ]] ||
    { echo "compare.sh: RUN must be KIND-sSEED with KIND full, none, cluster-strict, cluster-strict-next, cluster-paper, lsh or sparse, got '$run'" >&2; exit 2; }
  [[ ${PRECISION:-fp32} == fp32 || $run != full-* ]] ||
    { echo "compare.sh: PRECISION=bf16 takes the plug-in's task (--autocast-bf16); '$run' is fairseq's own transformer_lm" >&2; exit 2; }
  progress=$(python "$repo/examples/checkpoint_progress.py" "$work/ckpt/$run/checkpoint_last.pt") ||
    { echo "compare.sh: $run: cannot tell how far it trained (above); replace or move away that file" >&2; exit 2; }
  trained+=("${progress%% *}")
done
mkdir -p "$work/logs" "$work/results/code" "$work/causal"
failed() {  # say which run and which log, and show its end, instead of dying silently under set -e
  echo "compare.sh: $1 failed; the end of $2:" >&2
  tail -n 20 "$2" >&2
  exit 1
}
reach=$((4 * (WINDOW - 1)))  # train.sh's 4 windowed layers: full attention is scored in the same buckets
for i in "${!runs[@]}"; do
  run=${runs[i]}
  kind=${run%-s*} seed=${run##*-s} save=$work/ckpt/$run
  values=own layer_kind=$kind
  [ "$kind" != cluster-strict-next ] || { values=next layer_kind=cluster-strict; }
  if [ "${trained[i]}" -lt "$UPDATES" ]; then
    echo "$run: training (${trained[i]} of $UPDATES updates done), log $work/logs/$run.train.log"
    VALUES=$values bash "$repo/examples/longrange/train.sh" "$layer_kind" "$seed" "$data" "$save" --dropout 0.1 \
      ${precision[@]+"${precision[@]}"} \
      >> "$work/logs/$run.train.log" 2>&1 || failed "$run: training" "$work/logs/$run.train.log"
    rm -f "$work/results/code/$run.json"  # scores of an earlier, shorter run
  fi
  if [ ! -f "$work/results/code/$run.json" ]; then
    extra=()
    [ "$kind" != full ] || extra=(--reach "$reach")
    echo "$run: scoring the test split"
    fairseq-clusterformer-longrange "$data" --path "$save/checkpoint_last.pt" --tokens-per-sample "$TOKENS" \
      --context-window 0 --documents line "${extra[@]}" --json "$work/results/code/$run.json" \
      > "$work/logs/$run.score.log" 2>&1 || failed "$run: scoring" "$work/logs/$run.score.log"
  fi
  if [ "$kind" = cluster-paper ] && [ ! -f "$work/causal/$run.json" ]; then
    echo "$run: scoring the first ${CAUSAL_BLOCKS:-4} blocks token by token from their prefixes"
    fairseq-clusterformer-causal-eval "$data" --path "$save/checkpoint_last.pt" --tokens-per-sample "$TOKENS" \
      --context-window 0 --max-tokens "$TOKENS" --max-blocks "${CAUSAL_BLOCKS:-4}" \
      --json "$work/causal/$run.json" > "$work/logs/$run.causal.log" 2>&1 || failed "$run: causal scoring" "$work/logs/$run.causal.log"
  fi
done
python "$repo/examples/longrange/report.py" "$work/results" --out "$work/report"
