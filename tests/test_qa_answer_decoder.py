"""The answer decoder (qa/ops/spans.py) against an exhaustive search, the one decoder shared by validation and the
prediction script, and a data layer that loads without the model's modules."""

import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_clusterformer.qa.criterion import ClusterFormerQACriterion
from fairseq_clusterformer.qa.data.predictions import answer_type_name
from fairseq_clusterformer.qa.ops.spans import decode_answers
from fairseq_clusterformer.qa.scripts.predict import predict
from tests.conftest import PACKAGE
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_model import batch, build

PAD, PARAGRAPH, WORD = 1, 4, 7
LOGIT = st.floats(-4, 4, width=32)


@st.composite
def decoder_inputs(draw):
    """A batch of contexts (paragraph and word tokens, padded at the end) with random head logits."""
    bsz, length = draw(st.integers(1, 3)), draw(st.integers(1, 12))
    rows = []
    for _ in range(bsz):
        used = draw(st.integers(0, length))
        tokens = draw(st.lists(st.sampled_from([PARAGRAPH, WORD, WORD]), min_size=used, max_size=used))
        rows.append(tokens + [PAD] * (length - used))
    logits = {
        key: torch.tensor(draw(st.lists(LOGIT, min_size=bsz * width, max_size=bsz * width))).view(bsz, width)
        for key, width in (("start", length), ("end", length), ("paragraph", length), ("answer_type", 3))
    }  # each B x width
    return torch.tensor(rows), logits, draw(st.integers(1, 6)), draw(st.booleans())


def exhaustive_best_score(tokens, start, end, max_len):
    """Best start[s] + end[e] over every pair a decoder may answer: s <= e < s + max_len, no padding or paragraph
    token anywhere in [s, e] (so the answer stays in one paragraph). -inf when no pair qualifies."""
    best = float("-inf")
    for s in range(len(tokens)):
        for e in range(s, min(len(tokens), s + max_len)):
            if all(t == WORD for t in tokens[s : e + 1]):
                best = max(best, float(start[s]) + float(end[e]))
    return best


@settings(max_examples=150, deadline=None)
@given(decoder_inputs())
def test_decoder_equals_exhaustive_search_over_all_spans(inputs):
    context, logits, max_len, answer_types = inputs
    if not answer_types:
        logits = {"start": logits["start"], "end": logits["end"]}
    predictions = decode_answers(logits, context, PAD, PARAGRAPH, max_len)
    assert len(predictions) == context.size(0)
    for row, pred in enumerate(predictions):
        tokens, start, end = context[row].tolist(), logits["start"][row], logits["end"][row]
        best = exhaustive_best_score(tokens, start, end, max_len)
        if best == float("-inf"):
            assert pred.span_score == best and pred.start == pred.end == 0
        else:
            # ties may pick any best pair: the one picked must be allowed and score the best score
            assert pred.start <= pred.end < pred.start + max_len
            assert all(t == WORD for t in tokens[pred.start : pred.end + 1])
            assert float(start[pred.start]) + float(end[pred.end]) == pytest.approx(best, abs=1e-5)
            assert pred.span_score == pytest.approx(best, abs=1e-5)
        if not answer_types:
            assert pred.answer_type is None and pred.paragraph is None and pred.paragraph_score is None
            continue
        types = logits["answer_type"][row].tolist()
        assert types[pred.answer_type] == max(types)
        marks = [float(logits["paragraph"][row, i]) for i, t in enumerate(tokens) if t == PARAGRAPH]
        if not marks:
            assert pred.paragraph_score == float("-inf")
            continue
        # ranked by log-probability, which may round logits a few ulps apart to the same value
        assert marks[pred.paragraph] == pytest.approx(max(marks), abs=1e-5)
        norm = math.log(sum(math.exp(m) for m in marks))
        assert pred.paragraph_score == pytest.approx(max(marks) - norm, abs=1e-5)


@pytest.mark.parametrize("nq", [False, True])
def test_validation_scores_the_answers_the_prediction_script_writes(tmp_path_factory, monkeypatch, nq):
    """One batch of the whole valid split through the criterion, and the prediction script one question at a
    time (other padding, other batching): the same answer for every question, and the criterion's EM texts are
    those answers' spans."""
    task, model = build(shared_data(tmp_path_factory, nq=nq))
    model.double()  # padding changes nothing in double precision, so near-ties cannot flip between the two runs
    task.load_dataset("valid")
    sample = batch(task, "valid", list(range(len(task.dataset("valid")))))
    script = dict(predict(model, task, "valid", batch_size=1))
    decoded, scored = [], []
    decode = task.decode_answers
    monkeypatch.setattr(task, "decode_answers", lambda *a: decoded.extend(decode(*a)) or decoded)
    monkeypatch.setattr(task, "answer_text", lambda split, i, s, e: scored.append((i, s, e)) or "")
    with torch.no_grad():
        ClusterFormerQACriterion(task).evaluate(model(**sample["net_input"]), sample)
    assert sorted(script) == sorted(sample["example_index"]) and len(decoded) == len(script)
    for index, pred in zip(sample["example_index"], decoded):
        alone = script[index]
        assert (alone.answer_type, alone.start, alone.end, alone.paragraph) == (
            pred.answer_type,
            pred.start,
            pred.end,
            pred.paragraph,
        )
        assert alone.span_score == pytest.approx(pred.span_score, abs=1e-9)
    short = [(i, p.start, p.end) for i, p in script.items() if answer_type_name(p.answer_type) == "short"]
    assert sorted(scored) == sorted(short)
    assert all((p.paragraph is not None) == nq for p in script.values())


def imported_by(module: str) -> list:
    """The package modules that importing ``module`` loads. The package's own __init__ registers every model,
    task and criterion on purpose; an empty stand-in package isolates what ``module`` itself needs."""
    code = (
        "import sys, types\n"
        f"package = types.ModuleType('fairseq_clusterformer'); package.__path__ = [{str(PACKAGE)!r}]\n"
        "sys.modules['fairseq_clusterformer'] = package\n"
        f"import {module}\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('fairseq_clusterformer.', 'fairseq.')))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return out.split()


@pytest.mark.parametrize(
    "module", ["fairseq_clusterformer.qa.data.dataset", "fairseq_clusterformer.qa.data.predictions"]
)
def test_qa_data_does_not_load_the_model_layers(module):
    loaded = imported_by(module)
    assert module in loaded
    rooms = ("layers", "refresh", "lm", "compat", "checkpoints")
    model = ("model", "encoder", "heads", "pretrained", "task", "criterion")
    own = [m.split(".") for m in loaded if m.startswith("fairseq_clusterformer.")]
    assert [".".join(m) for m in own if m[1] in rooms or m[1] == "qa" and len(m) > 2 and m[2] in model] == []


def test_the_answer_decoder_needs_no_fairseq():
    loaded = imported_by("fairseq_clusterformer.qa.ops.spans")
    assert "fairseq_clusterformer.qa.ops.spans" in loaded
    assert [m for m in loaded if m.startswith("fairseq.")] == []
