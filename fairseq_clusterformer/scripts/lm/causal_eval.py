"""Score a split twice, as fairseq-eval-lm does and with the future cut off, to measure how much a model leaks.

    fairseq-clusterformer-causal-eval data-bin/wikitext-103 --path checkpoints/checkpoint_best.pt \\
        --tokens-per-sample 3072 --context-window 2560 --max-blocks 20 --json leak.json

``plain`` is fairseq-eval-lm's own computation: the same task, ``LMContextWindowDataset`` blocks (through the task's
``eval_lm_dataloader``), batches and ``SequenceScorer``, one forward per batch of blocks. ``causal`` scores each of
those tokens again from an input cut right after it (``src_tokens[: i + 1]``), so no later token can reach its
prediction. A strictly causal model gets the same loss both ways up to float noise; the paper's Cluster-Former
windows (``--cluster-causality paper``) let a prediction depend on later tokens of its block, and the gap says how
much of the plain perplexity that is worth. The causal pass costs one prefix per scored token (``--batch-prefixes``
of them per forward), hence ``--max-blocks``: both passes then score the same first N blocks.
Every fairseq-eval-lm flag is accepted (the parser is fairseq's); --user-dir is implied.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from fairseq import checkpoint_utils, options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import FairseqLanguageModel
from fairseq.sequence_scorer import SequenceScorer
from torch import Tensor

import fairseq_clusterformer  # noqa: F401  registers the clusterformer models and tasks (and fixes the batching)
from fairseq_clusterformer.layers.centroid_check import naming_checkpoint
from fairseq_clusterformer.scripts.cli_logging import log_like_fairseq

logger = logging.getLogger("fairseq_clusterformer.causal_eval")


@dataclass
class Totals:
    """Natural-log probabilities of the scored tokens, summed in float64 (eval_lm sums float32: equal to ~1e-7)."""

    tokens: int = 0
    log_prob: float = 0.0

    def add(self, scores: Tensor) -> None:
        # eval_lm skips the tokens a model gives an infinite score; so does each pass here
        finite = scores[torch.isfinite(scores)]
        self.tokens += finite.numel()
        self.log_prob += float(finite.double().sum())

    def summary(self) -> dict[str, float]:
        nats = -self.log_prob / self.tokens if self.tokens else 0.0
        return {
            "tokens": self.tokens,
            "loss_nats": nats,
            "loss_base2": nats / math.log(2),
            "perplexity": math.exp(nats),
            "bits_per_token": nats / math.log(2),
        }


@dataclass
class TokenGaps:
    """|causal - plain| per token, over the tokens both passes scored: a mean gap near 0 can hide gaps of both signs."""

    tokens: int = 0
    total: float = 0.0
    largest: float = 0.0

    def add(self, causal: Tensor, plain: Tensor) -> None:
        gaps = (causal - plain)[torch.isfinite(causal) & torch.isfinite(plain)].abs()
        self.tokens += gaps.numel()
        self.total += float(gaps.double().sum())
        self.largest = max(self.largest, float(gaps.max())) if gaps.numel() else self.largest


def prefixes(src: Tensor, positions: Tensor, pad: int) -> Tensor:
    """R x L: row r is ``src[: positions[r] + 1]`` right-padded with ``pad`` (L = longest prefix)."""
    length = int(positions.max()) + 1
    columns = torch.arange(length, device=src.device)
    return src[:length].expand(positions.numel(), length).masked_fill(columns > positions[:, None], pad)


@torch.no_grad()
def last_token_log_probs(model: FairseqLanguageModel, tokens: Tensor, lengths: Tensor, targets: Tensor) -> Tensor:
    """R log-probs of ``targets`` at each row's last real position of ``tokens`` (R x L, right-padded)."""
    features, extra = model.decoder(tokens, src_lengths=lengths, features_only=True)  # R x L x C
    last = features[torch.arange(tokens.size(0), device=tokens.device), lengths - 1].unsqueeze(1)  # R x 1 x C
    # only the last position is projected: R x V rather than R x L x V
    net_output = (model.decoder.output_layer(last), extra)
    sample = {"target": targets[:, None]}  # read by the adaptive softmax
    log_probs = model.get_normalized_probs(net_output, log_probs=True, sample=sample)  # R x 1 x V
    return log_probs.gather(-1, targets[:, None, None]).view(-1).float()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = options.get_eval_lm_parser()
    group = parser.add_argument_group("causal re-scoring")
    group.add_argument("--max-blocks", type=int, default=0, help="score only the first N blocks (0: all of them)")
    group.add_argument("--batch-prefixes", type=int, default=16, help="prefixes per forward in the causal pass")
    group.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    args = options.parse_args_and_arch(parser, argv)
    # refuse here, by flag, what would otherwise fail deep inside the dataset or silently score nothing
    if args.max_blocks < 0:
        parser.error(f"--max-blocks must be >= 0 (0 = every block), got {args.max_blocks}")
    if args.batch_prefixes < 1:
        parser.error(f"--batch-prefixes must be >= 1, got {args.batch_prefixes}")
    if args.context_window < 0:
        parser.error(f"--context-window must be >= 0, got {args.context_window}")
    if args.context_window >= args.tokens_per_sample:
        parser.error(
            f"--context-window ({args.context_window}) must be smaller than --tokens-per-sample "
            f"({args.tokens_per_sample}): each block scores the tokens-per-sample minus context-window newest tokens"
        )
    if not args.path:
        parser.error("--path: name the checkpoint to score")
    if not Path(args.path).is_file():  # the eval-lm parser has no --checkpoint-suffix: the file is --path itself
        parser.error(f"--path {args.path}: no such checkpoint file")
    if not Path(str(args.data).split(":")[0], "dict.txt").is_file():
        parser.error(f"data directory {args.data}: no dict.txt there (the folder fairseq-preprocess wrote)")
    if args.output_word_probs or args.output_word_stats or args.post_process:
        parser.error("--output-word-probs, --output-word-stats and --post-process are not supported here")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json {args.json}: folder {args.json.parent} does not exist")
    return args


def evaluate(args: argparse.Namespace) -> dict:
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    # from here to the batch iterator: fairseq_cli/eval_lm.py's main(), step for step
    if cfg.eval_lm.context_window > 0:
        cfg.task.tokens_per_sample -= cfg.eval_lm.context_window
    task = tasks.setup_task(cfg.task)
    with naming_checkpoint(cfg.common_eval.path):
        models, _, task = checkpoint_utils.load_model_ensemble_and_task(
            [cfg.common_eval.path],
            arg_overrides=eval(cfg.common_eval.model_overrides),  # a dict literal, as fairseq-eval-lm reads it
            suffix=cfg.checkpoint.checkpoint_suffix,
            strict=(cfg.checkpoint.checkpoint_shard_count == 1),
            num_shards=cfg.checkpoint.checkpoint_shard_count,
            task=task,
        )
    model = models[0]
    use_cuda = torch.cuda.is_available() and not cfg.common.cpu
    if use_cuda:
        torch.cuda.set_device(cfg.distributed_training.device_id)
        model.cuda()
    if cfg.common.fp16:
        model.half()
    model.prepare_for_inference_(cfg)
    task.load_dataset(cfg.dataset.gen_subset)
    batches = task.eval_lm_dataloader(
        dataset=task.dataset(cfg.dataset.gen_subset),
        max_tokens=cfg.dataset.max_tokens or 36000,
        batch_size=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(model.max_positions()),
        num_shards=max(cfg.dataset.num_shards, cfg.distributed_training.distributed_world_size),
        shard_id=max(cfg.dataset.shard_id, cfg.distributed_training.distributed_rank),
        num_workers=cfg.dataset.num_workers,
        data_buffer_size=cfg.dataset.data_buffer_size,
        context_window=cfg.eval_lm.context_window,
    )
    scorer = SequenceScorer(task.target_dictionary, cfg.eval_lm.softmax_batch)
    pad = task.target_dictionary.pad()
    skip_bos = int(getattr(cfg.task, "add_bos_token", False))  # eval_lm's remove_bos_token: not scored
    plain, causal, gaps, blocks = Totals(), Totals(), TokenGaps(), 0
    for sample in batches:
        if "net_input" not in sample:
            continue
        if args.max_blocks and blocks >= args.max_blocks:
            # drain the loader instead of leaving it: a loader abandoned half-way keeps its background reader
            # thread, and with torch 2.0 (fairseq 0.12.2's set-up) the process then aborts at exit
            continue
        sample = utils.move_to_cuda(sample) if use_cuda else sample
        hypos = scorer.generate([model], sample)  # the plain pass: every block of the batch at once
        rows = len(hypos) if not args.max_blocks else min(len(hypos), args.max_blocks - blocks)
        for row in range(rows):
            scores = hypos[row][0]["positional_scores"].float()
            # SequenceScorer scored positions start .. start + len - 1 of this row: score each from its prefix
            start = sample.get("start_indices", [0] * len(hypos))[row]
            src, target = sample["net_input"]["src_tokens"][row], sample["target"][row]
            positions = torch.arange(start + skip_bos, start + scores.numel(), device=src.device)
            if positions.numel() == 0:  # a block holding nothing but its beginning-of-sentence token
                continue
            chunks = positions.split(args.batch_prefixes)
            cut = torch.cat([last_token_log_probs(model, prefixes(src, c, pad), c + 1, target[c]) for c in chunks])
            plain.add(scores[skip_bos:])
            causal.add(cut)
            gaps.add(cut, scores[skip_bos:])
        blocks += rows
        logger.info(f"{blocks} blocks, {plain.tokens} tokens scored both ways")
    result = {
        "checkpoint": cfg.common_eval.path,
        "subset": cfg.dataset.gen_subset,
        "tokens_per_sample": args.tokens_per_sample,
        "context_window": args.context_window,
        "blocks": blocks,
        "plain": plain.summary(),
        "causal": causal.summary(),
    }
    result["gap_nats"] = result["causal"]["loss_nats"] - result["plain"]["loss_nats"]
    result["gap_base2"] = result["causal"]["loss_base2"] - result["plain"]["loss_base2"]
    result["perplexity_ratio"] = result["causal"]["perplexity"] / result["plain"]["perplexity"]
    result["mean_abs_token_gap_nats"] = gaps.total / gaps.tokens if gaps.tokens else 0.0
    result["max_abs_token_gap_nats"] = gaps.largest
    return result


def print_table(result: dict) -> None:
    print(f"{result['subset']}: {result['blocks']} blocks ({result['checkpoint']})")
    print(f"{'':7} {'tokens':>8} {'loss (nats)':>12} {'loss (base 2)':>14} {'perplexity':>11} {'bits/token':>11}")
    for name in ("plain", "causal"):
        s = result[name]
        print(
            f"{name:7} {s['tokens']:>8} {s['loss_nats']:>12.5f} {s['loss_base2']:>14.5f} {s['perplexity']:>11.3f}"
            f" {s['bits_per_token']:>11.4f}"
        )
    print(
        f"gap (causal - plain): {result['gap_nats']:+.6f} nats, {result['gap_base2']:+.6f} bits; "
        f"perplexity ratio {result['perplexity_ratio']:.5f}"
    )
    print(
        f"per-token |causal - plain|: mean {result['mean_abs_token_gap_nats']:.6f} nats, "
        f"largest {result['max_abs_token_gap_nats']:.6f} nats"
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    result = evaluate(args)
    print_table(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


def cli_main() -> None:
    log_like_fairseq()
    main(sys.argv[1:])


if __name__ == "__main__":
    cli_main()
