"""Split a language model's test loss by how far back the predicted token last occurred, and measure whether the
long-range layers attend to that earlier occurrence.

    fairseq-clusterformer-longrange data-bin/wikitext-2 --path checkpoints/checkpoint_best.pt \\
        --tokens-per-sample 1024 --context-window 512 --json longrange.json

Works for any fairseq language model checkpoint: this plug-in's (the reach defaults to what its stacked sliding
windows can carry, layers x (window - 1)) and fairseq's own ``transformer_lm`` (pass ``--reach``, the same as for
the windowed models it is compared with). The split is read as one token stream, as fairseq-eval-lm reads it with
``--sample-break-mode none``, and scored in blocks: each block of ``tokens-per-sample - context-window`` tokens is
predicted from an input that also holds up to ``context-window`` tokens before it. Tokens fall into the buckets of
``ops.recurrence`` (never / within reach / beyond reach / beyond input). With ``--documents line`` every line of the
raw text is its own document (a token that occurred only in an earlier line counts as ``never``).

The mechanism statistic (printed for models with long-range layers): for the tokens of the ``beyond reach`` bucket,
the share whose long-range layers, in each such layer, read the state that predicted the earlier occurrence or the
state holding it, and the share that read the state holding it (in a causal model the state that predicted a token
had not seen it, so only that one can be copied); beside each the share that as many keys drawn at random from the
query's past would hit. With ``--recall-facts``, also the share of recalled values that read their first occurrence.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import torch
from fairseq.data import data_utils
from fairseq.models import FairseqLanguageModel
from torch import Tensor

import fairseq_clusterformer  # noqa: F401  registers the clusterformer models and tasks
from fairseq_clusterformer.lm.decoder import ClusterFormerDecoder
from fairseq_clusterformer.scripts.cli_logging import log_like_fairseq
from fairseq_clusterformer.scripts.longrange.longrange_tally import ROLES, LayerCapture, Tally, print_tables
from fairseq_clusterformer.scripts.model_loading import load_model

logger = logging.getLogger("fairseq_clusterformer.longrange")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fairseq-clusterformer-longrange", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="binarised data folder (fairseq-preprocess --only-source)")
    parser.add_argument("--path", type=Path, required=True, help="language model checkpoint to score")
    parser.add_argument("--gen-subset", default="test", help="split to score (default: test)")
    parser.add_argument("--tokens-per-sample", type=int, default=1024, help="input length per forward")
    parser.add_argument("--context-window", type=int, default=512, help="tokens of context before each block")
    parser.add_argument("--reach", type=int, help="sliding-window reach in tokens (default: layers x (window - 1))")
    parser.add_argument("--documents", choices=("stream", "line"), default="stream", help="what one document is")
    parser.add_argument("--score-tokens", type=int, default=0, help="score only the first N tokens (0: all)")
    # fairseq's --max-tokens is a batch size; taken here it would silently score a prefix, so it is refused
    parser.add_argument("--max-tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--recall-facts",
        type=Path,
        help="the recall task's <split>.facts.jsonl: also report the loss on the recalled answers and, as a control,"
        " on their first occurrences (needs --documents line)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU even when CUDA is there")
    args = parser.parse_args(argv)
    # refuse by flag what would otherwise score nothing or fail deep inside the model
    if args.context_window < 0 or args.context_window >= args.tokens_per_sample:
        parser.error(f"--context-window must be in [0, --tokens-per-sample), got {args.context_window}")
    if args.reach is not None and args.reach < 0:
        parser.error(f"--reach must be >= 0, got {args.reach}")
    if args.max_tokens is not None:
        parser.error(
            "--max-tokens: this scorer reads one block of --tokens-per-sample at a time and has no batch size;"
            " to score only the first N tokens of the split, pass --score-tokens N"
        )
    if args.score_tokens < 0:
        parser.error(f"--score-tokens must be >= 0 (0 = all), got {args.score_tokens}")
    if not args.path.is_file():
        parser.error(f"--path {args.path}: no such checkpoint file")
    if not (args.data / "dict.txt").is_file():
        parser.error(f"data folder {args.data}: no dict.txt there (the folder fairseq-preprocess wrote)")
    if args.recall_facts is not None and not args.recall_facts.is_file():
        parser.error(f"--recall-facts {args.recall_facts}: no such file")
    if args.recall_facts is not None and args.documents != "line":
        parser.error("--recall-facts: the facts are indexed by line, so it needs --documents line")
    if args.json is not None and args.json.is_dir():
        parser.error(f"--json {args.json}: is a directory; give the path of a file")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json {args.json}: folder {args.json.parent} does not exist")
    return args


def read_stream(data: Path, subset: str, dictionary, documents: str) -> tuple[Tensor, Tensor]:
    """The split as one stream of N tokens (every line ends with its end-of-sentence token) and N document ids."""
    dataset = data_utils.load_indexed_dataset(os.path.join(data, subset), dictionary)
    if dataset is None:
        raise FileNotFoundError(f"--gen-subset {subset}: no binarised split {data / subset}.bin")
    lines = [dataset[i].long() for i in range(len(dataset))]
    stream = torch.cat(lines)  # N
    if documents == "stream":
        return stream, torch.zeros_like(stream)
    lengths = torch.tensor([len(line) for line in lines])
    return stream, torch.repeat_interleave(torch.arange(len(lines)), lengths)  # N document ids


def recall_roles(path: Path, documents: Tensor) -> Tensor:
    """ROLES index of every stream position, from the recall task's facts file: a fact's value, or every word of a
    copy after its first, is "recalled" where it is written the second time and "first occurrence" the first time."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    lengths = torch.bincount(documents)  # D: tokens per line, with its end of line
    if len(records) != len(lengths):
        raise SystemExit(f"--recall-facts {path}: {len(records)} documents, the split has {len(lengths)} lines")
    starts = torch.cumsum(lengths, 0) - lengths  # D: stream position of each line's first token
    roles = torch.zeros_like(documents)  # N
    for line, placed in enumerate(records):
        for record in placed:
            width = 2 if record["kind"] == "fact" else record["length"]
            for role, at in (("recalled", record["recall"]), ("first occurrence", record["first"])):
                if at + width >= lengths[line]:  # the last word of the span must lie before the end of line
                    raise SystemExit(f"--recall-facts {path}: line {line + 1} is too short for {record}")
                begin = int(starts[line]) + at + 1  # the span's first word is a key (fact) or unpredictable (copy)
                roles[begin : begin + width - 1] = ROLES.index(role)
    return roles


def default_reach(model) -> int:
    decoder = model.decoder
    if not isinstance(decoder, ClusterFormerDecoder):
        raise SystemExit(
            "--reach: this model has full attention, so its own reach is its input; pass the reach of the windowed "
            "models it is compared with (layers x (window - 1)) so that the buckets are the same"
        )
    window = decoder.layers[0].settings.window_size
    return len(decoder.layers) * (window - 1)


@torch.no_grad()
def score_blocks(model, stream: Tensor, eos: int, args: argparse.Namespace, tally: Tally, capture: LayerCapture):
    """Score stream[s : s + B] for s = 0, B, 2B, ... from inputs x[a : s + B], x = [eos] + stream."""
    device = next(model.parameters()).device
    x = torch.cat([stream.new_tensor([eos]), stream])  # N + 1: position j predicts stream[j]
    total = stream.numel() if not args.score_tokens else min(args.score_tokens, stream.numel())
    block = args.tokens_per_sample - args.context_window
    for start in range(0, total, block):
        end = min(start + block, total)
        first = max(0, start - args.context_window)  # x position of the input's first token
        tokens = x[first:end].to(device)[None]  # 1 x L
        targets = stream[first:end].to(device)[None]  # 1 x L
        capture.clear()
        net_output = model(tokens)
        log_probs = model.get_normalized_probs(net_output, log_probs=True, sample={"target": targets})  # 1 x L x V
        scores = log_probs.gather(-1, targets[..., None])[0, :, 0].float().cpu()  # L
        local = torch.arange(start - first, end - first)  # the block's tokens inside the input
        # x[first] holds stream[first - 1]: that is the first stream token the input shows
        tally.add(local + first, scores[local], input_start=max(first - 1, 0), capture=capture, first=first)
        if (start // block) % 50 == 0:
            logger.info(f"{end:,} of {total:,} tokens scored")


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    overrides = {"data": str(args.data)}
    needed = "it needs a language-model checkpoint (--task clusterformer_lm or language_modeling)"
    try:
        model, _cfg, task = load_model(args.path, overrides, FairseqLanguageModel, needed, args.cpu)
    except ValueError as error:
        raise SystemExit(f"fairseq-clusterformer-longrange: error: {error}") from None
    reach = args.reach if args.reach is not None else default_reach(model)
    dictionary = task.source_dictionary
    stream, documents = read_stream(args.data, args.gen_subset, dictionary, args.documents)
    roles = recall_roles(args.recall_facts, documents) if args.recall_facts else None
    capture = LayerCapture(model)
    tally = Tally(stream, documents, reach, roles)
    try:
        score_blocks(model, stream, dictionary.eos(), args, tally, capture)
    finally:
        capture.remove()
    result = {
        "checkpoint": str(args.path),
        "subset": args.gen_subset,
        "tokens_per_sample": args.tokens_per_sample,
        "context_window": args.context_window,
        "documents": args.documents,
        "reach": reach,
        **tally.summary(),
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print_tables(result)
    return result


def cli_main() -> None:
    log_like_fairseq()
    main()  # argparse reads sys.argv


if __name__ == "__main__":
    cli_main()
