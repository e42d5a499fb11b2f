"""--context-overflow truncate: a training context keeps whole paragraphs, the gold ones first, with its spans
re-indexed onto the same tokens; a validation context keeps its first tokens whatever the answers; both counted."""

import logging
import random

import numpy as np
import pytest
import torch
from fairseq import tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit, QAExample
from fairseq_clusterformer.qa.data.dataset import QADataset, QALimits
from fairseq_clusterformer.qa.data.truncation import keep_gold_paragraphs, paragraph_blocks
from tests.data.qa_model.synthetic import shared_data
from tests.test_qa_model import parse

P = 3  # the paragraph token of the hand-made contexts; words are >= 100


class InMemorySplit:
    """What QADataset reads of a QABinarizedSplit, from hand-made token lists."""

    data_dir, paragraph_id = "mem", P

    def __init__(self, examples: list, split: str = "train") -> None:
        self.split = split
        self.questions = [torch.tensor(q) for q, _, _ in examples]
        self.contexts = [torch.tensor(c) for _, c, _ in examples]
        self.metas = [meta for _, _, meta in examples]
        self.question_sizes = np.array([len(q) for q in self.questions])

    def __len__(self) -> int:
        return len(self.metas)

    def __getitem__(self, i: int) -> QAExample:
        return QAExample(self.questions[i], self.contexts[i], self.metas[i])


def article(*lengths: int) -> list:
    """``<p>`` plus ``n`` words per paragraph; paragraph k's words are 100 * (k + 1) + 0, 1, ... (no two alike)"""
    return [t for k, n in enumerate(lengths) for t in [P] + [100 * (k + 1) + w for w in range(n)]]


def meta(context: list, spans: list, answer_type=None, long_answer=-1) -> dict:
    starts = [i for i, t in enumerate(context) if t == P]
    return {"spans": spans, "answer_type": answer_type, "long_answer": long_answer, "paragraph_starts": starts}


def load(examples: list, limit: int, training: bool = True, overflow: str = "truncate") -> QADataset:
    split = InMemorySplit(examples, "train" if training else "valid")
    return QADataset(split, QALimits(8, limit, context_overflow=overflow, training=training), pad=1)


def paragraphs_of(context) -> list:
    """Each paragraph's first word: which paragraphs a context holds, in its order."""
    context = list(context)
    return [context[i + 1] for i, t in enumerate(context[:-1]) if t == P]


def test_the_gold_paragraph_is_kept_even_when_last_and_its_span_points_at_the_same_tokens():
    context = article(4, 3, 5, 3)  # paragraphs of 5, 4, 6, 4 tokens with their <p>
    gold = (len(context) - 2, len(context) - 1)  # the last two words of the last paragraph
    data = load([([5], context, meta(context, [list(gold)]))], limit=10)
    item, sample = data.items[0], data[0]
    kept = sample["context"].tolist()
    # the gold paragraph (4 tokens), then in document order what still fits: the first paragraph (5), not 4 or 6
    assert kept == article(4) + [P, 400, 401, 402] and len(kept) <= 10
    assert paragraphs_of(kept) == [100, 400]  # document order
    (start, end), (old_start, old_end) = item.spans[0], gold
    assert kept[start : end + 1] == context[old_start : old_end + 1] == [401, 402]
    assert data.truncated == 1 and not data.lost["spans"] and not data.skipped
    batch = data.collater([sample])
    assert batch["spans"][0, 0].tolist() == [start, end]
    assert batch["meta"][0]["paragraph_starts"] == [0, 5] and batch["meta"][0]["spans"] == [[start, end]]


def test_random_articles_keep_their_gold_spans_order_and_limit():
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 12) for _ in range(rng.randint(1, 8))]
        context = article(*lengths)
        words = [i for i, t in enumerate(context) if t != P]
        spans = sorted((s, s) for s in rng.sample(words, min(len(words), rng.randint(1, 3))))
        limit = rng.randint(3, len(context) + 2)
        data = load([([5], context, meta(context, [list(s) for s in spans]))], limit=limit)
        # a span of one word always fits: no example is left out
        assert len(data) == 1 and not data.skipped
        kept = data[0]["context"].tolist()
        assert len(kept) <= limit and len(kept) == data.items[0].context_len
        order = paragraphs_of(kept)
        assert order == sorted(order) and kept[0] == P
        kept_tokens = [kept[s : e + 1] for s, e in data.items[0].spans]
        assert kept_tokens and all(t in [context[s : e + 1] for s, e in spans] for t in kept_tokens)
        # when a gold paragraph fits the limit, one is kept whole
        blocks = paragraph_blocks(np.array(context), P)
        fitting = [(a, b) for a, b in blocks if b - a <= limit and any(a <= s < b for s, _ in spans)]
        if fitting:
            assert any(kept[i : i + b - a] == context[a:b] for a, b in fitting for i in range(len(kept)))
        assert data.lost["spans"] == len(spans) - len(kept_tokens)


def test_a_gold_paragraph_longer_than_the_limit_is_cut_around_its_span():
    context = article(3, 40, 3)
    gold = [26, 27]  # the middle paragraph's words 221 and 222, far from its start
    data = load([([5], context, meta(context, [gold]))], limit=10)
    kept, (start, end) = data[0]["context"].tolist(), data.items[0].spans[0]
    assert len(kept) == 10 and kept[0] == P and paragraphs_of(kept) == [kept[1]]
    assert kept[start : end + 1] == context[26:28] and 0 < start - 1 and end < 9


def test_a_validation_context_keeps_its_first_tokens_whatever_the_answers():
    context = article(4, 3, 5, 3)
    answers = [[[1, 2]], [[len(context) - 2, len(context) - 1]], [], [[7, 7], [17, 18]]]
    data = load([([5], context, meta(context, spans)) for spans in answers], limit=10, training=False)
    assert len(data) == 4 and data.truncated == 4
    for n in range(4):
        assert data[n]["context"].tolist() == context[:10]
    assert data.lost["spans"] == 2 and data.gold_spans == 4  # the two spans in the last paragraph
    assert [item.spans for item in data.items] == [[(1, 2)], [], [], [(7, 7)]]
    assert "4 of 4 examples kept, 4 of them truncated (first tokens)" in data.report()
    assert "lost to truncation: 2 of 4 gold spans" in data.report()
    # the same answers in the training split move the cut
    assert load([([5], context, meta(context, answers[1]))], limit=10)[0]["context"].tolist() != context[:10]


def test_kept_truncated_and_skipped_are_counted_by_reason():
    short, long = article(3, 2), article(4, 3, 5, 3)
    examples = [
        ([5], short, meta(short, [[1, 1]])),  # kept whole
        ([5], long, meta(long, [[17, 18]])),  # truncated, its gold paragraph kept
        ([5] * 9, long, meta(long, [[1, 1]])),  # question over 8 tokens
        ([5], long, meta(long, [])),  # nothing to learn from
        ([5], article(30), meta(article(30), [[1, 20]])),  # a gold span wider than the limit
    ]
    data = load(examples, limit=10)
    assert [item.index for item in data.items] == [0, 1] and data.truncated == 1
    assert data.skipped == {"question_too_long": 1, "no_gold_span_in_context": 2}
    assert "2 of 5 examples kept, 1 of them truncated (gold paragraphs first)" in data.report()
    skipping = load(examples, limit=10, overflow="skip")
    assert skipping.skipped == {"question_too_long": 1, "context_too_long": 3} and skipping.truncated == 0


def test_a_long_answer_paragraph_is_kept_and_re_indexed():
    context = article(6, 5, 2)
    data = load([([5], context, meta(context, [], "long", long_answer=2))], limit=9)
    kept, item = data[0]["context"].tolist(), data.items[0]
    starts = data.collater([data[0]])["meta"][0]["paragraph_starts"]
    # the long answer (3 tokens), then the second paragraph (6); the first (7) no longer fits
    assert paragraphs_of(kept) == [200, 300] and item.long_answer == 1 and kept[starts[1] + 1] == 300
    assert keep_gold_paragraphs(np.array(context), P, 9, [], long_answer_start=13) == [(7, 16)]
    valid = load([([5], context, meta(context, [], "long", long_answer=2))], limit=9, training=False)
    assert valid.items[0].long_answer == -1 and valid.lost["long_answers"] == 1
    assert "1 long answers" in valid.report()


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    return shared_data(tmp_path_factory)


def test_the_task_truncates_by_default_and_decodes_spans_in_the_cut_context(qa_data, caplog):
    caplog.set_level(logging.INFO, logger="fairseq_clusterformer")
    split = QABinarizedSplit(str(qa_data), "train")
    limit = int(np.median(split.context_sizes))
    task = tasks.setup_task(convert_namespace_to_omegaconf(parse(qa_data, "--max-context-train", limit)).task)
    dataset = task.load_dataset("train")
    long = [n for n, item in enumerate(dataset.items) if split.context_sizes[item.index] > limit]
    assert long and dataset.truncated == len(long) and len(dataset) == len(split)
    assert f"{len(split)} of {len(split)} examples kept, {len(long)} of them truncated" in caplog.text
    moved = 0
    for n in long:
        item, context = dataset.items[n], dataset[n]["context"]
        assert len(context) <= limit
        for start, end in item.spans:
            assert task.answer_text("train", item.index, start, end) in split.metas[item.index]["answers"]
        moved += not dataset.items[n].cut.is_prefix
    assert moved, "no gold paragraph ever lay past the limit: the data does not test answer-aware cuts"
    assert dataset.moves_positions  # what qa_predict checks before writing NQ offsets
