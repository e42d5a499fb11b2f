"""The CPU-scale QA path: paragraph-level SQuAD on the committed dev set, the trivial baselines (checked on a split
small enough to score by hand), the masked-LM pretraining text and examples/qa/cpu_recipe.sh's commands."""

import importlib.util
import json
import random
import subprocess

import pytest

from benchmarks.qa_report import baselines as qa_baselines
from fairseq_clusterformer.qa.data.records import QARecord
from tests.conftest import REPO, subprocess_env
from tests.test_qa_convert import SQUAD, convert

SQUAD_DEV = REPO / "examples" / "data" / "squad" / "dev-v1.1.json"
BPE = REPO / "examples" / "data" / "gpt2_bpe"
RECIPE = REPO / "examples" / "qa" / "cpu_recipe.sh"
# the recipe's own script beside it, loaded from its file as the recipe runs it
_spec = importlib.util.spec_from_file_location("qa_mlm_text", REPO / "examples" / "qa" / "mlm_text.py")
qa_mlm_text = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qa_mlm_text)


def test_paragraph_contexts_of_the_committed_squad_dev_set(tmp_path):
    articles = json.loads(SQUAD_DEV.read_text())["data"]
    # every question of the held-out articles 40-47, none skipped (articles 0-39 hold the other 8,981)
    assert sum(len(p["qas"]) for a in articles[:40] for p in a["paragraphs"]) == 8981
    _, records = convert("squad", SQUAD_DEV, tmp_path / "p.jsonl", "--articles", "40:", "--context-unit", "paragraph")
    assert len(records) == 1589 == sum(len(p["qas"]) for a in articles[40:] for p in a["paragraphs"])
    for r in records:
        a = int(r.context_id.split("#")[1].split("/")[0])
        paragraph = articles[a]["paragraphs"][r.extra["paragraph"]]["context"]
        assert r.paragraphs == [paragraph]
        assert r.spans and all(p == 0 and paragraph[s:e] in r.answers for p, s, e in r.spans)
    assert len({r.context_id for r in records}) == len({(r.context_id, r.extra["paragraph"]) for r in records})
    # the default is unchanged: the whole article, spans into the question's own paragraph
    _, whole = convert("squad", SQUAD_DEV, tmp_path / "a.jsonl", "--articles", "40:")
    assert len(whole) == 1589 and len(whole[0].paragraphs) == len(articles[40]["paragraphs"])
    assert whole[0].spans[0][0] == whole[0].extra["paragraph"]


def test_paragraph_contexts_of_a_small_file(tmp_path):
    src = tmp_path / "squad.json"
    src.write_text(json.dumps(SQUAD))
    _, by_article = convert("squad", src, tmp_path / "a.jsonl")
    _, by_paragraph = convert("squad", src, tmp_path / "p.jsonl", "--context-unit", "paragraph")
    assert [r.id for r in by_paragraph] == [r.id for r in by_article]
    for article, paragraph in zip(by_article, by_paragraph):
        p = article.extra["paragraph"]
        assert paragraph.paragraphs == [article.paragraphs[p]]
        assert paragraph.spans == [[0, s, e] for _, s, e in article.spans]
    # a record written without its paragraphs must find them again: one context per paragraph, not per article
    assert len({r.context_id for r in by_paragraph}) > len({r.context_id for r in by_article})


def test_prepare_squad_refuses_an_unknown_context_unit(tmp_path):
    (tmp_path / "dev-v1.1.json").write_text(json.dumps(SQUAD))
    proc = subprocess.run(
        ["bash", REPO / "examples" / "qa" / "prepare_squad.sh", "--data", tmp_path, "--split-dev", "1",
         "--contexts", "sentence", "--out", tmp_path / "out"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "--contexts sentence" in proc.stderr


def record(qid, context, *answers):
    return QARecord(id=qid, question="?", paragraphs=[context], answers=list(answers))


TRAIN = [record("t1", "x", "a"), record("t2", "x", "a b"), record("t3", "x", "a b"), record("t4", "x", "a b c d e")]
EVAL = [record("q1", "Alpha beta gamma delta", "Alpha beta"), record("q2", "The cat sat on the mat", "cat sat")]


def test_first_span_by_hand():
    # median length 2 words: "Alpha beta" is exact; "The cat" normalises to "cat", against "cat sat": P 1, R 1/2
    table = qa_baselines.baselines(TRAIN, EVAL, seed=1)
    first = table["first_span"]
    assert first["words"] == 2 and first["questions"] == 2
    assert first["exact_match"] == pytest.approx(50.0)
    assert first["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)


def test_random_span_is_seeded_and_a_span_of_the_context():
    lengths = qa_baselines.answer_lengths(TRAIN)
    assert lengths == [1, 2, 2, 5]
    context = "one two three four five six seven"
    spans = [qa_baselines.random_span(context, lengths, random.Random(7)) for _ in range(2)]
    assert spans[0] == spans[1]  # the same seed, the same span
    rng = random.Random(3)
    seen = {qa_baselines.random_span(context, lengths, rng) for _ in range(200)}
    assert all(s in context and len(s.split()) in lengths for s in seen) and len(seen) > 10
    # a one-word context can only be answered by that word, whatever length was drawn
    table = qa_baselines.baselines(TRAIN, [record("q", "Paris", "Paris")], seed=5)
    assert table["random_span"]["exact_match"] == 100.0


def test_baselines_cli_scores_prediction_files(tmp_path):
    for name, records in (("train", TRAIN), ("eval", EVAL)):
        (tmp_path / f"{name}.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    (tmp_path / "pred.json").write_text(json.dumps({"q1": "the Alpha beta"}))  # q2 unanswered: it scores 0
    args = qa_baselines.get_parser().parse_args(
        ["--train", str(tmp_path / "train.jsonl"), "--eval", str(tmp_path / "eval.jsonl"),
         "--predictions", f"model={tmp_path / 'pred.json'}", "--json", str(tmp_path / "out.json"),
         "--first-words", "3"]
    )  # fmt: skip
    table = qa_baselines.main(args)
    assert table["model"] == {"exact_match": 50.0, "f1": 50.0, "questions": 2, "answered": 1}
    assert json.loads((tmp_path / "out.json").read_text()) == table
    # "Alpha beta gamma" against "Alpha beta": P 2/3, R 1; "The cat sat" against "cat sat": exact after normalising
    assert table["first_3_words"]["exact_match"] == 50.0
    assert table["first_3_words"]["f1"] == pytest.approx(100 * (0.8 + 1) / 2)
    with pytest.raises(ValueError, match="--predictions"):
        qa_baselines.score_predictions(EVAL, str(tmp_path / "pred.json"))
    with pytest.raises(ValueError, match="--train"):
        qa_baselines.baselines([record("t", "x")], EVAL, seed=1)
    args.first_words = [0]
    with pytest.raises(ValueError, match="--first-words 0"):
        qa_baselines.main(args)


def test_mlm_text_reads_only_the_chosen_articles(tmp_path):
    articles = json.loads(SQUAD_DEV.read_text())["data"]
    text = tmp_path / "extra.txt"
    text.write_text("Some text .\n\n \nMore text .\n")
    args = qa_mlm_text.get_parser().parse_args(
        ["--squad", str(SQUAD_DEV), "--articles", "0:2", "--text", str(text), "--encoder-json",
         str(BPE / "encoder.json"), "--vocab-bpe", str(BPE / "vocab.bpe"), "--output", str(tmp_path / "out.bpe")]
    )  # fmt: skip
    lines, tokens = qa_mlm_text.main(args)
    paragraphs = sum(len(a["paragraphs"]) for a in articles[:2])
    assert lines == paragraphs + 2  # the empty and blank lines are left out
    written = (tmp_path / "out.bpe").read_text().splitlines()
    assert len(written) == lines and sum(len(line.split()) for line in written) == tokens
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    bpe = get_encoder(str(BPE / "encoder.json"), str(BPE / "vocab.bpe"))
    decoded = [bpe.decode([int(i) for i in line.split()]) for line in written]
    assert decoded[0] == articles[0]["paragraphs"][0]["context"].strip() and decoded[-1] == "More text ."
    held_out = articles[40]["paragraphs"][0]["context"].strip()
    assert held_out not in decoded
    with pytest.raises(FileNotFoundError, match="--text"):
        qa_mlm_text.main(
            qa_mlm_text.get_parser().parse_args(
                ["--text", str(tmp_path / "missing"), "--encoder-json", "e", "--vocab-bpe", "v", "--output", "o"]
            )
        )


def recipe(*args, **env):
    full_env = subprocess_env(**env)
    return subprocess.run(["bash", RECIPE, *map(str, args)], env=full_env, capture_output=True, text=True,
                          timeout=60, cwd=REPO)  # fmt: skip


def test_cpu_recipe_help_and_dry_run(tmp_path):
    proc = recipe("--help")
    assert proc.returncode == 0 and "--dry-run" in proc.stdout and "masked_lm" in proc.stdout
    proc = recipe("--dry-run", "--out", tmp_path / "out", DIM="64", SEEDS="3 4")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    pretrain = next(line for line in lines if "--task masked_lm" in line)
    finetunes = [line for line in lines if "train.sh" in line]
    # the fine-tunings of one stage run side by side, so their commands come in any order
    pretrained = [line for line in finetunes if f"ROBERTA={tmp_path / 'out' / 'roberta'} " in line]
    assert len(finetunes) == 3 and sorted("SEED=3 " in line for line in pretrained) == [False, True]
    assert sum("SEED=4 " in line for line in pretrained) == 1
    for line in [pretrain, *finetunes]:  # the QA model refuses a pretrained encoder of another shape
        assert "--encoder-embed-dim 64 --encoder-ffn-embed-dim 256" in line and "--max-positions 256" in line
    assert any("--split-dev 40 --contexts paragraph" in line for line in lines)
    # the masked-LM text never reads the held-out articles
    assert any("qa/mlm_text.py" in line and "--articles 0:40" in line for line in lines)
    assert sum("qa.scripts.predict" in line for line in lines) == 3
    scoring = next(line for line in lines if "qa_report.baselines" in line)
    assert all(f"--predictions {name}=" in scoring for name in ("qa_scratch_seed1", "qa_mlm_seed3", "qa_mlm_seed4"))
    # with --roberta: no pretraining, the fine-tunings start from that directory
    roberta = tmp_path / "roberta"
    roberta.mkdir()
    (roberta / "model.pt").write_bytes(b"")
    lines = recipe("--dry-run", "--out", tmp_path / "out2", "--roberta", roberta).stdout.splitlines()
    assert not any("masked_lm" in line or "mlm_text.py" in line for line in lines)
    assert sum(f"ROBERTA={roberta} " in line for line in lines) == 2
    proc = recipe("--data", tmp_path, "--dry-run")
    assert proc.returncode == 2 and "--data" in proc.stderr
    proc = recipe("--roberta", tmp_path / "out", "--dry-run")
    assert proc.returncode == 2 and "--roberta" in proc.stderr
