"""QA evaluation metrics, as the official scripts define them. Pure Python, no fairseq, no torch.

- SQuAD v1.1 ``evaluate-v1.1.py`` (also what Quasar-T and SearchQA are reported with in R^3 / DS-QA and in the
  Cluster-Former paper): answer normalisation, exact match, token F1, the max over the gold answers, and the average
  over all questions x 100 with an unanswered question scoring 0.
- Natural Questions ``nq_eval.py``: long-answer and short-answer precision / recall / F1 over examples, with gold
  answers decided by the vote of the annotators (at least ``non_null_threshold`` = 2 non-null annotations), and the
  score-threshold sweep that reports the best F1.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """F1 of the multiset of normalised tokens; 0 when nothing is shared (so two empty answers give 0)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    return _f1(pred, ref)


def token_f1_v2(prediction: str, gold: str) -> float:
    """SQuAD 2.0's F1 (``evaluate-v2.0.py``): as v1.1, except that an empty side scores 1 if both are empty."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    return _f1(pred, ref)


def _f1(pred: list[str], ref: list[str]) -> float:
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def max_over_gold(metric, prediction: str, golds: Sequence[str]) -> float:
    """The best score of ``prediction`` against any gold answer (0 if there is none)."""
    return max((metric(prediction, gold) for gold in golds), default=0.0)


def squad_scores(
    golds: Mapping[str, Sequence[str]], predictions: Mapping[str, str], version: str = "1.1"
) -> dict[str, float]:
    """{"exact_match", "f1"} x 100, averaged over every gold question; a question with no prediction scores 0.

    ``version="2.0"`` scores as ``evaluate-v2.0.py``: a question without gold answers (unanswerable) has the gold
    answer "" and is right when the prediction is empty.
    """
    if not golds:
        raise ValueError("no gold questions to score")
    if version not in ("1.1", "2.0"):
        raise ValueError(f"version must be 1.1 or 2.0, got {version!r}")
    f1_metric = token_f1_v2 if version == "2.0" else token_f1
    em = f1 = 0.0
    for qid, answers in golds.items():
        if version == "2.0":
            answers = [a for a in answers if normalize_answer(a)] or [""]
        if qid in predictions:
            em += max_over_gold(exact_match, predictions[qid], answers)
            f1 += max_over_gold(f1_metric, predictions[qid], answers)
    return {"exact_match": 100.0 * em / len(golds), "f1": 100.0 * f1 / len(golds)}


# ---- Natural Questions --------------------------------------------------------------------------------------------

Span = tuple[int, int]  # [start_token, end_token) in document tokens; a null span has a negative offset


def is_null_span(span: Span | None) -> bool:
    return span is None or span[0] < 0 or span[1] < 0


@dataclass
class NQLabel:
    """One annotation (gold) or one prediction of a Natural Questions example, in document token offsets."""

    long_answer: Span | None = None
    short_answers: Sequence[Span] = field(default_factory=tuple)
    yes_no_answer: str = "NONE"
    long_score: float = 0.0
    short_score: float = 0.0

    def has_long(self) -> bool:
        return not is_null_span(self.long_answer)

    def short_set(self) -> frozenset[Span]:
        return frozenset(tuple(s) for s in self.short_answers if not is_null_span(s))

    def has_short(self) -> bool:
        """A short answer is a non-null span or a yes/no answer."""
        return bool(self.short_set()) or self.yes_no_answer.upper() != "NONE"


def nq_label_from_json(annotation: Mapping) -> NQLabel:
    """NQLabel of an official annotation or prediction object (token offsets; bytes are not used)."""
    long_answer = annotation.get("long_answer") or {}
    return NQLabel(
        long_answer=(long_answer.get("start_token", -1), long_answer.get("end_token", -1)),
        short_answers=tuple((s["start_token"], s["end_token"]) for s in annotation.get("short_answers") or []),
        yes_no_answer=str(annotation.get("yes_no_answer", "NONE")),
        long_score=float(annotation.get("long_answer_score", 0.0)),
        short_score=float(annotation.get("short_answers_score", 0.0)),
    )


def nq_prediction_from_json(prediction: Mapping) -> NQLabel:
    """NQLabel of one official prediction, refused as nq_eval.py's reader refuses it: a yes_no_answer other than
    yes / no / none (any case), or a yes/no answer beside a non-null short span."""
    label = nq_label_from_json(prediction)
    yes_no, where = label.yes_no_answer.lower(), f"prediction {prediction.get('example_id')!r}"
    if yes_no not in ("yes", "no", "none"):
        raise ValueError(f"{where}: invalid yes_no_answer {label.yes_no_answer!r}")
    if yes_no != "none" and label.short_set():
        raise ValueError(f"{where}: a yes/no answer and short answers cannot coexist (nq_eval.py refuses it)")
    return label


# one scored example: (gold has an answer, prediction has one, prediction is correct, prediction score)
AnswerStat = tuple[bool, bool, bool, float]


def score_long(gold: Sequence[NQLabel], pred: NQLabel | None, non_null_threshold: int = 2) -> AnswerStat:
    gold_has = sum(g.has_long() for g in gold) >= non_null_threshold
    pred_has = pred is not None and pred.has_long()
    correct = gold_has and pred_has and any(g.has_long() and g.long_answer == pred.long_answer for g in gold)
    return gold_has, pred_has, correct, pred.long_score if pred is not None else 0.0


def score_short(gold: Sequence[NQLabel], pred: NQLabel | None, non_null_threshold: int = 2) -> AnswerStat:
    gold_has = sum(g.has_short() for g in gold) >= non_null_threshold
    pred_has = pred is not None and pred.has_short()
    correct = False
    if gold_has and pred_has:
        if pred.yes_no_answer.upper() != "NONE":
            correct = any(pred.yes_no_answer.upper() == g.yes_no_answer.upper() for g in gold)
        else:
            # the annotator said yes/no (empty span set) never matches a span answer
            correct = any(g.short_set() == pred.short_set() for g in gold)
    return gold_has, pred_has, correct, pred.short_score if pred is not None else 0.0


def _safe_divide(x: float, y: float) -> float:
    return x / y if y else 0.0


def precision_recall_f1(stats: Iterable[AnswerStat]) -> dict[str, float]:
    """P = correct / predicted, R = correct / gold, F1 (the official ``--pretty_print`` numbers, scores ignored)."""
    stats = list(stats)
    correct = sum(s[2] for s in stats)
    precision = _safe_divide(correct, sum(s[1] for s in stats))
    recall = _safe_divide(correct, sum(s[0] for s in stats))
    return {"precision": precision, "recall": recall, "f1": _safe_divide(2 * precision * recall, precision + recall)}


def best_threshold(stats: Iterable[AnswerStat]) -> dict[str, float]:
    """Sweep a score threshold from the highest score down; the point with the best F1 (ties: the first reached)."""
    stats = sorted(stats, key=lambda s: s[3], reverse=True)
    total_gold = sum(s[0] for s in stats)
    points: dict[float, tuple[float, float]] = {}
    correct = predicted = 0
    for _, has_pred, is_correct, score in stats:
        correct += is_correct
        predicted += has_pred
        # with tied scores the last example of the tie decides: a threshold cannot split a tie
        points[score] = (_safe_divide(correct, predicted), _safe_divide(correct, total_gold))
    best = {"f1": 0.0, "precision": 0.0, "recall": 0.0, "threshold": 0.0}
    for threshold, (precision, recall) in points.items():
        f1 = _safe_divide(2 * precision * recall, precision + recall)
        if f1 > best["f1"]:
            best = {"f1": f1, "precision": precision, "recall": recall, "threshold": threshold}
    return best


def nq_scores(
    golds: Mapping[str, Sequence[NQLabel]], predictions: Mapping[str, NQLabel], non_null_threshold: int = 2
) -> dict[str, float]:
    """Long and short answer P/R/F1 (scores ignored) and best-threshold F1, as fractions in [0, 1].

    ``non_null_threshold`` is the official 2 for the 5-way annotated dev set; with one annotation per example (a split
    of the training set) use 1, or no gold would ever count as answered.
    """
    if set(predictions) - set(golds):
        raise ValueError(f"{len(set(predictions) - set(golds))} predictions for example ids that are not in the gold")
    long_stats = [score_long(golds[k], predictions.get(k), non_null_threshold) for k in golds]
    short_stats = [score_short(golds[k], predictions.get(k), non_null_threshold) for k in golds]
    out = {}
    for name, stats in (("long", long_stats), ("short", short_stats)):
        out.update({f"{name}-{k}": v for k, v in precision_recall_f1(stats).items()})
        out.update({f"{name}-best-threshold-{k}": v for k, v in best_threshold(stats).items()})
    return out
