"""Synthetic QA records in the project's JSONL record format, for the QA model tests.

Every context is several paragraphs of sentences "the colour of KEY is VALUE ." plus one sentence "the secret
word is VALUE ." that the question asks for ("what is the secret word ?"). Finding it is trivially learnable,
yet a random span is almost never right, so exact match far above chance means the model learned. In one
example in four the secret sentence appears twice (distant supervision: both occurrences are gold spans).
With ``nq=True`` the records carry Natural Questions answer types: no answer when the secret sentence is
missing, otherwise a short answer inside the long-answer paragraph.
"""

import json
import random

WORDS = (
    "amber basil cedar delta ember fjord garnet harbor indigo jasper kestrel lumen maple nectar onyx pepper quartz "
    "raven saffron tundra umber velvet willow xenon yarrow zephyr"
).split()
KEYS = "apple river stone cloud tower field glass paper".split()


def make_record(rng: random.Random, index: int, paragraphs: int, nq: bool = False) -> dict:
    answer = rng.choice(WORDS)
    texts = []
    for _ in range(paragraphs):
        sentences = [f"the colour of {rng.choice(KEYS)} is {rng.choice(WORDS)} ." for _ in range(rng.randint(2, 4))]
        texts.append(" ".join(sentences))
    has_answer = not nq or rng.random() < 0.7
    secret = f"the secret word is {answer} ."
    holders = []
    if has_answer:
        holders = rng.sample(range(paragraphs), 2 if rng.random() < 0.25 else 1)
        for p in holders:
            words = texts[p].split(" . ")
            at = rng.randint(0, len(words) - 1)
            texts[p] = " . ".join(words[:at] + [secret[:-2]] + words[at:])
    spans = []
    for p in holders:
        start = texts[p].index(secret) + len("the secret word is ")
        spans.append([p, start, start + len(answer)])
    record = {
        "id": f"syn{index}",
        "question": "what is the secret word ?",
        "paragraphs": texts,
        "answers": [answer] if has_answer else [],
        "spans": spans,
    }
    if nq:
        record.update(answer_type="short" if has_answer else "none", long_answer=holders[0] if has_answer else -1)
        record["extra"] = nq_extra(index, texts, holders[0] if has_answer else -1, spans[:1])
    return record


def nq_extra(index: int, texts: list, long_answer: int, spans: list) -> dict:
    """What the NQ converter keeps: the example id, one top-level candidate per paragraph (its document tokens are
    the paragraph's words, numbered across the document) and the official annotation."""
    candidates, start = [], 0
    for p, text in enumerate(texts):
        end = start + len(text.split(" "))
        candidates.append({"index": p, "start_token": start, "end_token": end, "words": [[start, end]]})
        start = end
    null = {"start_token": -1, "end_token": -1, "candidate_index": -1}
    annotation = {"long_answer": null, "short_answers": [], "yes_no_answer": "NONE"}
    if long_answer >= 0:
        c = candidates[long_answer]
        annotation["long_answer"] = {
            "start_token": c["start_token"],
            "end_token": c["end_token"],
            "candidate_index": long_answer,
        }
        for p, char_start, _ in spans:
            word = candidates[p]["start_token"] + texts[p][:char_start].count(" ")
            annotation["short_answers"].append({"start_token": word, "end_token": word + 1})
    return {"example_id": index, "candidates": candidates, "annotations": [annotation], "yes_no_answer": "NONE"}


def write_records(path, count: int, seed: int, paragraphs: tuple = (3, 6), nq: bool = False) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            f.write(json.dumps(make_record(rng, seed * 100_000 + i, rng.randint(*paragraphs), nq)) + "\n")


def binarize(root, train: int = 240, valid: int = 40, nq: bool = False, paragraphs: tuple = (2, 4)):
    """Write synthetic train/valid records under ``root`` and binarise them with the project's own tools
    (fairseq-clusterformer-train-spm, fairseq-clusterformer-qa-binarize). Returns the data directory."""
    from tests.conftest import run_ok

    write_records(root / "train.jsonl", train, 1, paragraphs, nq)
    write_records(root / "valid.jsonl", valid, 2, paragraphs, nq)
    run_ok(
        "fairseq-clusterformer-train-spm",
        "--input",
        root / "train.jsonl",
        "--model-prefix",
        root / "spm" / "qa",
        "--vocab-size",
        "300",
    )
    run_ok(
        "fairseq-clusterformer-qa-binarize",
        "--tokenizer",
        "sentencepiece",
        "--sentencepiece-model",
        root / "spm" / "qa.model",
        "--train",
        root / "train.jsonl",
        "--valid",
        root / "valid.jsonl",
        "--destdir",
        root / "bin",
    )
    return root / "bin"


def shared_data(tmp_path_factory, nq: bool = False):
    """The synthetic data set of this test session (240 train / 40 valid questions; NQ-style: 40 / 16), binarised
    once and shared by every QA test module. Treat it as read-only (copy it to change it)."""
    root = tmp_path_factory.getbasetemp() / ("qa_synthetic_nq" if nq else "qa_synthetic")
    if not (root / "bin" / "qa_config.json").is_file():
        root.mkdir(exist_ok=True)
        binarize(root, *((40, 16) if nq else (240, 40)), nq=nq)
    return root / "bin"
