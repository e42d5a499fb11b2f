"""SQuAD EM/F1 and Natural Questions long/short P/R/F1: hand-worked examples and the official rules' edge cases."""

import ast

import pytest

from fairseq_clusterformer.qa.ops import metrics as m
from fairseq_clusterformer.qa.ops.metrics import NQLabel
from tests.conftest import PACKAGE


@pytest.mark.parametrize(
    "text, normalised",
    [
        ("The U.S. Army", "us army"),
        ("  A cat,  the HAT!  ", "cat hat"),
        ("rock_and_roll", "rockandroll"),  # "_" is ASCII punctuation: deleted, not turned into a space
        ("theatre another", "theatre another"),  # articles only as whole words
        ("an", ""),
        ("Café – 1,000", "café – 1000"),  # only ASCII punctuation goes; the en dash stays
    ],
)
def test_normalize_answer(text, normalised):
    assert m.normalize_answer(text) == normalised


def test_exact_match_and_f1_hand_worked():
    assert m.exact_match("The U.S. Army", "us army") == 1.0
    assert m.exact_match("U.S. Army units", "us army") == 0.0
    # "cat sat" vs "cat sat down": P = 2/2, R = 2/3, F1 = 2 * 1 * 2/3 / (5/3) = 0.8
    assert m.token_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)
    # multiset overlap: "cat cat" vs "cat" shares one token: P = 1/2, R = 1, F1 = 2/3
    assert m.token_f1("the cat cat", "cat") == pytest.approx(2 / 3)
    assert m.token_f1("dog", "cat") == 0.0
    # the official quirk: two empty answers match exactly but have no common token, so F1 is 0
    assert m.exact_match("the", "a") == 1.0
    assert m.token_f1("the", "a") == 0.0
    assert m.token_f1("rock_and_roll", "Rock and Roll") == 0.0


def test_max_over_gold_and_average_over_all_questions():
    assert m.max_over_gold(m.token_f1, "cat sat", ["dog", "cat sat down", "cat"]) == pytest.approx(0.8)
    assert m.max_over_gold(m.exact_match, "x", []) == 0.0
    golds = {"q1": ["Paris", "paris france"], "q2": ["1990"], "q3": ["red planet"]}
    # q1 exact; q2 wrong; q3 missing from the predictions scores 0 but still counts in the average
    scores = m.squad_scores(golds, {"q1": "paris", "q2": "1991"})
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 / 3)
    scores = m.squad_scores({"q": ["red planet"]}, {"q": "the planet"})
    assert scores == {"exact_match": 0.0, "f1": pytest.approx(100 * 2 * 0.5 / 1.5)}
    with pytest.raises(ValueError, match="no gold"):
        m.squad_scores({}, {})


def test_squad_v2_no_answer_rules():
    # evaluate-v2.0: empty vs empty is F1 1 (v1.1 gives 0); an unanswerable question's gold is ""
    assert m.token_f1_v2("", "") == 1.0 and m.token_f1("", "") == 0.0
    assert m.token_f1_v2("the", "Paris") == 0.0 and m.token_f1_v2("cat sat", "cat sat down") == pytest.approx(0.8)
    golds = {"answerable": ["Paris"], "impossible": []}
    v2 = m.squad_scores(golds, {"answerable": "", "impossible": ""}, version="2.0")
    assert v2 == {"exact_match": 50.0, "f1": 50.0}
    v2 = m.squad_scores(golds, {"answerable": "paris", "impossible": "London"}, version="2.0")
    assert v2 == {"exact_match": 50.0, "f1": 50.0}
    # under v1.1 rules an unanswerable question can never score
    assert m.squad_scores(golds, {"answerable": "Paris", "impossible": ""}) == {"exact_match": 50.0, "f1": 50.0}


def ann(long=(-1, -1), short=(), yes_no="NONE"):
    return NQLabel(long_answer=long, short_answers=tuple(short), yes_no_answer=yes_no)


def pred(long=(-1, -1), short=(), yes_no="NONE", long_score=1.0, short_score=1.0):
    return NQLabel(long, tuple(short), yes_no, long_score, short_score)


def test_nq_long_answer_needs_two_annotators_and_any_match():
    one_vote = [ann((10, 20)), ann(), ann(), ann(), ann()]
    # a single non-null annotation does not make a gold answer: the prediction counts against precision only
    assert m.score_long(one_vote, pred((10, 20))) == (False, True, False, 1.0)
    two_votes = [ann((10, 20)), ann((30, 40)), ann(), ann(), ann()]
    assert m.score_long(two_votes, pred((30, 40))) == (True, True, True, 1.0)  # matching any annotator is enough
    assert m.score_long(two_votes, pred((10, 21))) == (True, True, False, 1.0)  # spans must match exactly
    assert m.score_long(two_votes, pred()) == (True, False, False, 1.0)
    assert m.score_long(two_votes, None) == (True, False, False, 0.0)  # no prediction for the example
    # one annotation per example (a training split) needs threshold 1
    assert m.score_long([ann((1, 5))], pred((1, 5)), non_null_threshold=1)[2]
    assert not m.score_long([ann((1, 5))], pred((1, 5)))[0]


def test_nq_short_answer_span_sets_and_yes_no():
    gold = [ann((0, 50), [(3, 5), (7, 8)]), ann((0, 50), [(3, 5)]), ann(), ann(), ann()]
    assert m.score_short(gold, pred((0, 50), [(7, 8), (3, 5)]))[2]  # the whole set of one annotator, any order
    assert m.score_short(gold, pred((0, 50), [(3, 5)]))[2]  # the second annotator's set
    assert not m.score_short(gold, pred((0, 50), [(7, 8)]))[2]  # a subset of a set is wrong
    assert not m.score_short(gold, pred((0, 50), [(3, 5), (7, 8), (9, 9)]))[2]
    yes = [ann((0, 9), yes_no="YES"), ann((0, 9), yes_no="YES"), ann(), ann(), ann()]
    assert m.score_short(yes, pred((0, 9), yes_no="YES")) == (True, True, True, 1.0)
    assert m.score_short(yes, pred((0, 9), yes_no="NO"))[:3] == (True, True, False)
    assert m.score_short(yes, pred((0, 9), [(2, 3)]))[:3] == (True, True, False)  # a span never equals a yes/no
    # a yes/no annotation and a span annotation together make two votes for "has a short answer"
    mixed = [ann((0, 9), yes_no="NO"), ann((0, 9), [(2, 3)]), ann(), ann(), ann()]
    assert m.score_short(mixed, pred((0, 9), [(2, 3)])) == (True, True, True, 1.0)
    assert m.score_short(gold, pred((0, 50), [(-1, -1)]))[1] is False  # a null span is no short answer


def test_nq_precision_recall_f1_and_threshold_sweep_hand_worked():
    stats = [(True, True, True, 0.9), (False, True, False, 0.8), (True, True, True, 0.7), (True, False, False, 0.1)]
    # correct 2, predicted 3, gold 3: P = R = F1 = 2/3
    assert m.precision_recall_f1(stats) == pytest.approx({"precision": 2 / 3, "recall": 2 / 3, "f1": 2 / 3})
    # sweep from 0.9 down: (P, R) = (1, 1/3) F1 0.5; (1/2, 1/3) F1 0.4; (2/3, 2/3) F1 2/3; (2/3, 2/3) again
    best = m.best_threshold(stats)
    assert best == pytest.approx({"f1": 2 / 3, "precision": 2 / 3, "recall": 2 / 3, "threshold": 0.7})
    # cutting at 0.9 alone would give F1 0.5; tied scores cannot be split: with the wrong example tied to the first,
    # the first point is (1/2, 1/3)
    tied = [(True, True, True, 0.9), (False, True, False, 0.9), (True, False, False, 0.1)]
    assert m.best_threshold(tied)["f1"] == pytest.approx(2 * 0.5 * 0.5 / 1.0)
    assert m.precision_recall_f1([(False, False, False, 0.0)]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_nq_scores_from_official_json():
    golds = {
        "1": [
            m.nq_label_from_json(a)
            for a in 2
            * [
                {
                    "long_answer": {"start_token": 10, "end_token": 24, "candidate_index": 0},
                    "short_answers": [{"start_token": 19, "end_token": 22}],
                    "yes_no_answer": "NONE",
                }
            ]
        ],
        "2": [
            m.nq_label_from_json(
                {
                    "long_answer": {"start_token": -1, "end_token": -1, "candidate_index": -1},
                    "short_answers": [],
                    "yes_no_answer": "NONE",
                }
            )
        ]
        * 5,
    }
    preds = {
        "1": m.nq_label_from_json(
            {
                "example_id": 1,
                "long_answer": {"start_token": 10, "end_token": 24, "start_byte": -1, "end_byte": -1},
                "long_answer_score": 2.0,
                "short_answers": [{"start_token": 19, "end_token": 21, "start_byte": -1, "end_byte": -1}],
                "short_answers_score": 1.0,
                "yes_no_answer": "NONE",
            }
        ),
        "2": m.nq_label_from_json(
            {
                "long_answer": {"start_token": 3, "end_token": 9},
                "long_answer_score": 0.5,
                "short_answers": [],
                "short_answers_score": 0.0,
            }
        ),
    }
    scores = m.nq_scores(golds, preds)
    # long: example 1 right, example 2 predicted where gold has none: P 1/2, R 1/1; the sweep stops at score 2.0
    assert scores["long-precision"] == 0.5 and scores["long-recall"] == 1.0
    assert scores["long-f1"] == pytest.approx(2 / 3)
    assert scores["long-best-threshold-f1"] == 1.0 and scores["long-best-threshold-threshold"] == 2.0
    assert scores["short-f1"] == 0.0  # [19, 21) is not the annotated [19, 22)
    with pytest.raises(ValueError, match="not in the gold"):
        m.nq_scores(golds, {**preds, "3": preds["2"]})


def test_metrics_module_is_pure():
    tree = ast.parse((PACKAGE / "qa" / "ops" / "metrics.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(name.split(".")[0] in {"fairseq", "torch"} for name in imported if name)
