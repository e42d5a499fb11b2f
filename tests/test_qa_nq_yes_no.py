"""Natural Questions yes/no answers: the converter keeps them as their own answer types, the heads and the decoder
can choose them, the prediction file says YES / NO as nq_eval.py expects, the scorer judges them by nq_eval.py's
rules, and a checkpoint trained before the yes/no classes still loads and answers as it did."""

import gzip
import json

import pytest
import torch

from fairseq_clusterformer.checkpoints.old_layouts import ADDED_CLASS_BIAS
from fairseq_clusterformer.qa.criterion import nq_counts
from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit
from fairseq_clusterformer.qa.data.dataset import answer_type_of
from fairseq_clusterformer.qa.data.predictions import answer_type_name, nq_prediction
from fairseq_clusterformer.qa.data.records import ANSWER_TYPES, SkipLog, read_records
from fairseq_clusterformer.qa.encoder import QAEncoderOut
from fairseq_clusterformer.qa.heads import QAHeads
from fairseq_clusterformer.qa.ops import metrics as m
from fairseq_clusterformer.qa.ops.spans import AnswerPrediction, decode_answers
from fairseq_clusterformer.qa.scripts import convert as qa_convert
from tests.test_qa_binarize import GPT2_FLAGS, binarize_ok, run_inprocess
from tests.test_qa_convert import nq_example
from tests.test_qa_model import batch, build, nq_data  # noqa: F401 (nq_data is a fixture)


def yes_no_annotation(answer="YES"):
    return {
        "long_answer": {"start_token": 10, "end_token": 24, "candidate_index": 0},
        "short_answers": [],
        "yes_no_answer": answer,
    }


NULL = {"long_answer": {"start_token": -1, "end_token": -1, "candidate_index": -1}, "short_answers": []}


def converted(tmp_path, lines, binarize=False):
    src = tmp_path / "nq.jsonl.gz"
    src.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    code, text = run_inprocess(qa_convert, "--format", "nq", src, tmp_path / "nq.jsonl")
    assert code == 0, text[-3000:]
    if binarize:
        binarize_ok(*GPT2_FLAGS, "--valid", tmp_path / "nq.jsonl", "--destdir", tmp_path / "bin")
        return QABinarizedSplit(str(tmp_path / "bin"), "valid")
    return [r for _, r in read_records(str(tmp_path / "nq.jsonl"), SkipLog())]


def test_converter_keeps_yes_and_no_as_answer_types(tmp_path):
    no_answer = [yes_no_annotation("NO"), {**NULL, "yes_no_answer": "NONE"}]
    records = converted(tmp_path, [nq_example(1, [yes_no_annotation()]), nq_example(2, no_answer), nq_example(3)])
    assert [r.answer_type for r in records] == ["yes", "no", "short"]
    assert [r.extra["yes_no_answer"] for r in records] == ["YES", "NO", "NONE"]
    # the long answer is still the paragraph to learn, and a yes/no has no span
    assert records[0].long_answer == 0 and records[0].spans == [] and records[0].answers == []


def test_data_binarised_before_the_yes_no_classes_reads_them_from_extra():
    old = {"answer_type": "long", "extra": {"yes_no_answer": "NO"}}
    assert answer_type_of(old) == "no" and ANSWER_TYPES.index(answer_type_of(old)) == 4
    assert answer_type_of({"answer_type": "long", "extra": {"yes_no_answer": "NONE"}}) == "long"
    assert answer_type_of({"answer_type": None, "extra": {}}) is None


def encoder_out(embed_dim=8, windows=2, question=3, length=6):
    torch.manual_seed(0)
    return QAEncoderOut(
        question=torch.randn(1, windows, question, embed_dim),
        context=torch.randn(1, length, embed_dim),
        question_valid=torch.ones(1, windows, question, dtype=torch.bool),
        layout=None,
    )


@pytest.mark.parametrize("winner", ["yes", "no"])
def test_heads_and_decoder_choose_a_yes_no_answer(winner):
    heads = QAHeads(8, answer_types=True, activation_fn="tanh", pooler_dropout=0.0).eval()
    with torch.no_grad():
        heads.answer_type.out_proj.bias.zero_()
        heads.answer_type.out_proj.bias[ANSWER_TYPES.index(winner)] = 100.0
        logits = heads(encoder_out())
    assert logits["answer_type"].shape == (1, 5)
    context = torch.tensor([[0, 5, 6, 0, 7, 8]])  # paragraph token 0 before each of two paragraphs, no padding
    (pred,) = decode_answers(logits, context, pad=1, paragraph=0, max_answer_tokens=3)
    assert answer_type_name(pred.answer_type) == winner and pred.paragraph in (0, 1)


def five(*annotations):
    labels = [m.nq_label_from_json(a) for a in annotations]
    return labels + [m.NQLabel()] * (5 - len(labels))


def test_yes_no_prediction_is_written_and_scored_as_nq_eval_does(tmp_path):
    data = converted(tmp_path, [nq_example(1, [yes_no_annotation()] * 2)], binarize=True)
    example = data[0]
    meta = example.meta
    written = nq_prediction(data.tokenizer, example.context, meta, "yes", 0, -0.2, (3, 5), 4.0)
    # nq_eval.py's reader: YES beside an empty span list, the long answer the paragraph's candidate
    assert written["yes_no_answer"] == "YES" and written["short_answers"] == []
    assert (written["long_answer"]["start_token"], written["long_answer"]["end_token"]) == (10, 24)
    assert written["short_answers_score"] == 4.0
    pred = m.nq_prediction_from_json(written)
    gold = [m.nq_label_from_json(a) for a in meta["extra"]["annotations"]]
    assert m.score_short(gold, pred, 1) == (True, True, True, 4.0)
    assert m.score_long(gold, pred, 1)[2]
    # the 2-of-5 vote: two yes annotators make a gold short answer; the prediction must equal one annotator's answer
    yes = yes_no_annotation()
    assert m.score_short(five(yes, yes), pred)[:3] == (True, True, True)
    assert m.score_short(five(yes_no_annotation("NO"), yes_no_annotation("NO")), pred)[:3] == (True, True, False)
    assert m.score_short(five(yes), pred)[:3] == (False, True, False)  # one vote: no gold short answer
    # yes and no annotators both count towards the vote, and either matches its own prediction
    assert m.score_short(five(yes, yes_no_annotation("NO")), pred)[:3] == (True, True, True)
    # a span gold never matches a yes/no prediction, whatever the annotation's text
    spans = {**yes, "short_answers": [{"start_token": 19, "end_token": 22}], "yes_no_answer": "NONE"}
    assert m.score_short(five(spans, spans), pred)[:3] == (True, True, False)
    for case in ("yes", "Yes"):  # nq_eval.py lower-cases both sides
        assert m.score_short(five(yes, yes), m.nq_prediction_from_json({**written, "yes_no_answer": case}))[2]


def test_prediction_reader_refuses_what_nq_eval_refuses():
    span = {"start_token": 19, "end_token": 22, "start_byte": -1, "end_byte": -1}
    base = {"example_id": 1, "long_answer_score": 0.0, "short_answers_score": 0.0, "short_answers": []}
    with pytest.raises(ValueError, match="cannot coexist"):
        m.nq_prediction_from_json({**base, "short_answers": [span], "yes_no_answer": "NO"})
    with pytest.raises(ValueError, match="invalid yes_no_answer 'MAYBE'"):
        m.nq_prediction_from_json({**base, "yes_no_answer": "MAYBE"})
    assert m.nq_prediction_from_json({**base, "short_answers": [span], "yes_no_answer": "none"}).has_short()


def test_validation_counts_a_yes_no_answer():
    sample = {
        "meta": [{"answer_type": "yes", "spans": [], "extra": {}}, {"answer_type": "long", "spans": [], "extra": {}}],
        "long_answer": torch.tensor([0, 1]),
    }
    predictions = [AnswerPrediction(ANSWER_TYPES.index("yes"), 3, 4, 1.0, 0, -0.1)] * 2
    counts = nq_counts(sample, predictions)
    # the first is right (long and short); the second has only a long answer, which the yes/no prediction's
    # paragraph 0 misses, and a short prediction without gold
    assert (counts["long_pred"], counts["long_gold"], counts["long_correct"]) == (2, 2, 1)
    assert (counts["short_pred"], counts["short_gold"], counts["short_correct"]) == (2, 1, 1)


def test_checkpoint_with_three_answer_types_loads_and_answers_as_before(nq_data):  # noqa: F811
    task, model = build(nq_data)
    sample = batch(task, "valid", [0, 1, 2])
    with torch.no_grad():
        before = model(**sample["net_input"])["answer_type"]
    old = {k: v.clone() for k, v in model.state_dict().items()}
    for key in ("qa_heads.answer_type.out_proj.weight", "qa_heads.answer_type.out_proj.bias"):
        old[key] = old[key][:3]  # none, long, short: the head before yes / no were added
    _, fresh = build(nq_data)
    fresh.load_state_dict(old)
    with torch.no_grad():
        after = fresh(**sample["net_input"])["answer_type"]
    assert torch.allclose(after[:, :3], before[:, :3], atol=1e-6)
    assert torch.all(after[:, 3:] == ADDED_CLASS_BIAS)
    assert set(after.argmax(dim=-1).tolist()) <= {0, 1, 2}
