"""The clusterformer_qa criterion: marginal likelihood of every gold span, NQ answer-type and long-answer losses,
and EM / F1 (NQ: long / short answer F1) on the validation line.

B = batch, T = context tokens, P = paragraphs.
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from fairseq_clusterformer.qa.data.dataset import answer_type_of
from fairseq_clusterformer.qa.data.predictions import answer_type_name
from fairseq_clusterformer.qa.ops.metrics import NQLabel, exact_match, max_over_gold, score_long, score_short, token_f1
from fairseq_clusterformer.qa.ops.spans import (
    AnswerPrediction,
    candidate_log_softmax,
    gold_span_log_likelihood,
    paragraph_positions,
    span_positions,
)

NQ_COUNTS = ("long_pred", "long_gold", "long_correct", "short_pred", "short_gold", "short_correct")


@dataclass
class ClusterFormerQACriterionConfig(FairseqDataclass):
    answer_type_weight: float = field(default=1.0, metadata={"help": "weight of the NQ answer-type loss"})
    long_answer_weight: float = field(default=1.0, metadata={"help": "weight of the NQ long-answer (paragraph) loss"})


@register_criterion("clusterformer_qa", dataclass=ClusterFormerQACriterionConfig)
class ClusterFormerQACriterion(FairseqCriterion):
    def __init__(self, task, answer_type_weight: float = 1.0, long_answer_weight: float = 1.0):
        super().__init__(task)
        self.answer_type_weight = answer_type_weight
        self.long_answer_weight = long_answer_weight

    def forward(self, model, sample, reduce=True):
        logits = model(**sample["net_input"])
        context = sample["net_input"]["context"]  # B x T
        valid = span_positions(context, self.padding_idx, self.task.paragraph)  # B x T
        span_ll, has_gold = gold_span_log_likelihood(logits["start"], logits["end"], valid, sample["spans"])
        span_loss = -span_ll.sum()
        loss = span_loss
        # a tensor, as the losses are: int() would make the host wait for the device in every step
        log = {"span_loss": span_loss.data, "span_examples": has_gold.sum()}
        if "answer_type" in logits:
            kinds = sample["answer_type"]  # B
            type_loss = F.cross_entropy(logits["answer_type"].float(), kinds, ignore_index=-1, reduction="sum")
            # P = T: a fixed width (the most paragraphs of the batch would be read back from the device)
            candidates = paragraph_positions(context, self.task.paragraph, context.size(1))  # B x P
            log_p = candidate_log_softmax(logits["paragraph"], candidates)  # B x P
            gold = sample["long_answer"]  # B, paragraph index or -1
            picked = log_p.gather(1, gold.clamp(min=0)[:, None])[:, 0]  # B
            long_loss = -picked.masked_fill(gold < 0, 0.0).sum()
            aux_loss = self.answer_type_weight * type_loss + self.long_answer_weight * long_loss
            loss = loss + aux_loss
            log.update(type_loss=type_loss.data, long_loss=long_loss.data, aux_loss=aux_loss.data)
        sample_size = sample["nsentences"]
        log.update(loss=loss.data, ntokens=sample["ntokens"], nsentences=sample_size, sample_size=sample_size)
        if not model.training:
            with torch.no_grad():
                log.update(self.evaluate(logits, sample))
        return loss, sample_size, log

    def evaluate(self, logits, sample) -> dict:
        """EM / F1 (NQ: also the long / short answer counts) of the answers the prediction script would give."""
        predictions = self.task.decode_answers(logits, sample["net_input"]["context"])
        em = f1 = 0.0
        for row, (meta, pred) in enumerate(zip(sample["meta"], predictions)):
            # no predicted short answer reads as the empty answer, which is right exactly when there is no gold
            # answer (SQuAD 2.0's rule, and the no-answer path of answer-type data)
            text = ""
            if answer_type_name(pred.answer_type) == "short":
                text = self.task.answer_text(sample["split"], sample["example_index"][row], pred.start, pred.end)
            row_em = max_over_gold(exact_match, text, meta["answers"] or [""])
            em += row_em
            f1 += max_over_gold(token_f1, text, meta["answers"]) if meta["answers"] else row_em
        scores = {"em_sum": em, "f1_sum": f1, "scored": len(sample["meta"])}
        if "answer_type" in logits:
            scores.update(nq_counts(sample, predictions))
        return scores

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        examples, span_examples = total("sample_size"), total("span_examples")
        # the span loss exists only for examples with a gold span in the context (an evaluation split keeps the
        # others, at loss 0): it is averaged over those; the answer-type losses over every example. Sums, not
        # per-batch means, so that batches with different counts combine exactly.
        for key, value in (("span", total("span_loss")), ("span_n", span_examples), ("aux", total("aux_loss"))):
            metrics.log_scalar_sum(f"_loss_{key}", value)
        metrics.log_scalar_sum("_loss_n", examples)
        metrics.log_derived("loss", _loss_meter)
        if any("type_loss" in log for log in logging_outputs):
            span_loss = total("span_loss") / max(span_examples, 1) / math.log(2)
            metrics.log_scalar("span_loss", span_loss, span_examples, round=3)
            for key in ("type_loss", "long_loss"):
                metrics.log_scalar(key, total(key) / max(examples, 1) / math.log(2), examples, round=3)
        scored = total("scored")
        if scored:
            metrics.log_scalar("em", 100.0 * total("em_sum") / scored, scored, round=2)
            metrics.log_scalar("f1", 100.0 * total("f1_sum") / scored, scored, round=2)
        if any("long_gold" in log for log in logging_outputs):
            # F1 is not a mean over batches: keep the counts (hidden "_" meters) and derive F1 from the totals
            for key in NQ_COUNTS:
                metrics.log_scalar_sum(f"_{key}", total(key))
            for kind in ("long", "short"):
                metrics.log_derived(f"{kind}_f1", _nq_f1_meter(kind))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def nq_counts(sample, predictions: list[AnswerPrediction]) -> dict:
    counts = dict.fromkeys(NQ_COUNTS, 0)
    for row, (meta, pred) in enumerate(zip(sample["meta"], predictions)):
        # NQ's rules in context-token space: a long answer is a paragraph, a short answer a set of spans or a yes/no;
        # one annotation per binarised example, so one non-null annotation makes the gold answered
        gold_long = int(sample["long_answer"][row])
        gold_kind = answer_type_of(meta)
        gold = NQLabel(
            long_answer=(gold_long, gold_long + 1) if gold_long >= 0 else None,
            short_answers=[tuple(s) for s in meta["spans"]] if gold_kind == "short" else (),
            yes_no_answer=gold_kind.upper() if gold_kind in ("yes", "no") else "NONE",
        )
        kind = answer_type_name(pred.answer_type)
        pred_label = NQLabel(
            long_answer=(pred.paragraph, pred.paragraph + 1) if kind != "none" else None,
            short_answers=[(pred.start, pred.end)] if kind == "short" else (),
            yes_no_answer=kind.upper() if kind in ("yes", "no") else "NONE",
        )
        for name, stat in (("long", score_long([gold], pred_label, 1)), ("short", score_short([gold], pred_label, 1))):
            gold_has, pred_has, correct, _ = stat
            counts[f"{name}_gold"] += gold_has
            counts[f"{name}_pred"] += pred_has
            counts[f"{name}_correct"] += correct
    return counts


def _loss_meter(meters) -> float:
    def part(name: str, count: str) -> float:
        n = float(meters[f"_loss_{count}"].sum)
        return float(meters[f"_loss_{name}"].sum) / n if n else 0.0

    return round((part("span", "span_n") + part("aux", "n")) / math.log(2), 3)


def _nq_f1_meter(kind: str):
    def derive(meters) -> float:
        pred, gold, correct = (meters[f"_{kind}_{part}"].sum for part in ("pred", "gold", "correct"))
        return round(100.0 * nq_f1(correct, pred, gold), 2)

    return derive


def nq_f1(correct: int, predicted: int, gold: int) -> float:
    """NQ's F1 at one threshold: P = correct / predicted non-null, R = correct / gold non-null."""
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0
