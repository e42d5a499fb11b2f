"""QA inputs and spans: RoBERTa's sentence-pair format, answers inside one paragraph, a validation loss over the
examples that can have one, and one question-length limit for the binariser and the task."""

import io
import math

import numpy as np
import pytest
import torch
from fairseq import metrics

from fairseq_clusterformer.qa.criterion import ClusterFormerQACriterion
from fairseq_clusterformer.qa.data.encode import RecordEncoder
from fairseq_clusterformer.qa.data.records import QARecord, SkipLog
from fairseq_clusterformer.qa.ops.spans import paragraph_ids
from fairseq_clusterformer.qa.ops.windows import QALayout, close_context, qa_tokens
from fairseq_clusterformer.qa.scripts.binarize import get_parser
from fairseq_clusterformer.qa.task import ClusterFormerQAConfig
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_model import batch, build, corrupt


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


def test_windows_are_robertas_sentence_pair_input():
    bos, eos, pad = 0, 2, 1
    question = torch.tensor([[10, 11], [20, pad]])
    context = torch.tensor([[30, 31, 32, 33, 34], [40, 41, pad, pad, pad]])
    closed = close_context(context, eos, pad)
    assert closed.tolist() == [[30, 31, 32, 33, 34, eos], [40, 41, eos, pad, pad, pad]]
    layout = QALayout(question.size(1) + 3, closed.size(1), 4, 3)
    _, windows = qa_tokens(question, closed, layout, bos, eos, pad)
    # <s> q </s></s> ctx ... and the window holding the end of the context closes it with </s>
    assert windows[0, 0].tolist() == [bos, 10, 11, eos, eos, 30, 31, 32, 33]
    assert windows[0, 1].tolist() == [bos, 10, 11, eos, eos, 33, 34, eos, pad]
    assert windows[1, 0].tolist() == [bos, 20, eos, eos, pad, 40, 41, eos, pad]


def test_evaluation_never_predicts_across_a_paragraph_token(qa_data, monkeypatch):
    task, _ = build(qa_data)
    sample = batch(task, "valid", [0])
    context = sample["net_input"]["context"]  # 1 x T
    boundary = int(torch.nonzero(context[0].eq(task.paragraph))[1])  # the second paragraph's marker
    start = torch.full(context.shape, -10.0)
    end = torch.full(context.shape, -10.0)
    start[0, boundary - 1], end[0, boundary + 1] = 10.0, 10.0  # the best unconstrained span crosses the marker
    start[0, boundary + 1], end[0, boundary - 1] = 3.0, 3.0
    seen = []
    monkeypatch.setattr(task, "answer_text", lambda split, index, s, e: seen.append((s, e)) or "")
    ClusterFormerQACriterion(task).evaluate({"start": start, "end": end}, sample)
    assert seen in ([(boundary - 1, boundary - 1)], [(boundary + 1, boundary + 1)])
    segments = paragraph_ids(context, task.paragraph)[0]
    assert segments[boundary - 1] != segments[boundary + 1]


def test_validation_loss_averages_over_the_examples_with_a_gold_span(qa_data, tmp_path):
    data = corrupt(qa_data, tmp_path, lambda i, meta: {**meta, "spans": []} if i == 0 else meta)
    task, model = build(data)
    criterion = ClusterFormerQACriterion(task)
    sample = batch(task, "valid", [0, 1])
    with torch.no_grad():
        _, _, log = criterion(model, sample)
        logits = model(**sample["net_input"])
    with metrics.aggregate() as agg:
        criterion.reduce_metrics([log])
        reported = agg.get_smoothed_values()["loss"]
    rows = [r for r, meta in enumerate(sample["meta"]) if meta["spans"]]
    assert len(rows) == 1
    row = rows[0]
    context = sample["net_input"]["context"][row]
    valid = context.ne(task.dictionary.pad()) & context.ne(task.paragraph)
    log_start = torch.log_softmax(logits["start"][row][valid].double(), dim=0)
    log_end = torch.log_softmax(logits["end"][row][valid].double(), dim=0)
    at = torch.cumsum(valid, dim=0) - 1  # position in the context -> position among the valid ones
    likelihood = sum(math.exp(log_start[at[s]] + log_end[at[e]]) for s, e in sample["meta"][row]["spans"])
    assert reported == pytest.approx(-math.log(likelihood) / math.log(2), abs=2e-3)


class WordTokenizer:
    """One token per character, ids 10..: enough for the binariser's length check."""

    def encode(self, text):
        return np.arange(10, 10 + len(text), dtype=np.int64), np.ones(len(text), dtype=np.int64)


def test_binariser_and_task_skip_the_same_questions():
    binariser = get_parser().parse_args(["--destdir", "unused"]).max_question_tokens
    assert binariser == ClusterFormerQAConfig().max_question_tokens == 64
    encoder = RecordEncoder(WordTokenizer(), paragraph_id=4)
    log = SkipLog(stream=io.StringIO())
    for length in (64, 65):
        encoder.encode(QARecord(id=str(length), question="q" * length, paragraphs=["some text"]), "here", log)
    assert dict(log.skipped) == {"question_too_long": 1}
