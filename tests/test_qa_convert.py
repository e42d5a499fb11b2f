"""Converters: small samples written here in each data set's published format (the data sets' own documentation; the
examples are made up in the published shape), the real SQuAD files committed in examples/data/squad, and bad input."""

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from fairseq_clusterformer.qa.data.records import SkipLog, read_records
from fairseq_clusterformer.qa.scripts import convert as qa_convert
from tests.conftest import REPO, run_cli, run_ok, subprocess_env

DATA = REPO / "examples" / "data"


def convert(fmt, src, out, *extra):
    """Run the converter in-process; returns (written, records read back, stderr)."""
    args = qa_convert.get_parser().parse_args(["--format", fmt, str(src), str(out), *map(str, extra)])
    written = qa_convert.main(args)
    log = SkipLog()
    records = [r for _, r in read_records(str(out), log)]
    # the only lines that do not read back as records are the ones naming an example the converter skipped
    markers = [line for line in Path(out).read_text().splitlines() if "skipped" in json.loads(line)]
    assert sum(log.skipped.values()) == len(markers), "the converter wrote records that do not read back"
    return written, records


SQUAD = {
    "version": "1.1",
    "data": [
        {
            "title": "Mars",
            "paragraphs": [
                {
                    "context": "Mars is the fourth planet. It is called the Red Planet.",
                    "qas": [
                        {
                            "id": "q1",
                            "question": "Which planet is fourth?",
                            "answers": [{"text": "Mars", "answer_start": 0}, {"text": "Mars ", "answer_start": 0}],
                        },
                        {
                            "id": "q2",
                            "question": "What is it called?",
                            "answers": [
                                {"text": "the Red Planet", "answer_start": 40},
                                {"text": "Red Planet", "answer_start": 3},
                            ],
                        },
                    ],
                },
                {
                    "context": "Phobos and Deimos orbit Mars.",
                    "qas": [
                        {
                            "id": "q3",
                            "question": "What orbits Mars?",
                            "answers": [{"text": "Phobos", "answer_start": 0}],
                        },
                        {"id": "q4", "question": "Broken?", "answers": [{"text": "Venus", "answer_start": 5}]},
                    ],
                },
            ],
        },
        {
            "title": "Moon",
            "paragraphs": [
                {
                    "context": "The Moon orbits Earth.",
                    "qas": [
                        {
                            "id": "q5",
                            "question": "What does the Moon orbit?",
                            "answers": [{"text": "Earth", "answer_start": 16}],
                        },
                        {
                            "id": "q6",
                            "question": "Who lives there?",
                            "answers": [],
                            "is_impossible": True,
                            "plausible_answers": [{"text": "Moon", "answer_start": 4}],
                        },
                    ],
                }
            ],
        },
    ],
}


def test_squad_article_is_one_context_and_every_question_a_record(tmp_path, capsys):
    src = tmp_path / "squad.json"
    src.write_text(json.dumps(SQUAD))
    written, records = convert("squad", src, tmp_path / "out.jsonl")
    err = capsys.readouterr().err
    assert written == len(records) == 5  # q4 has only a mismatched answer
    by_id = {r.id: r for r in records}
    mars = ["Mars is the fourth planet. It is called the Red Planet.", "Phobos and Deimos orbit Mars."]
    assert all(by_id[q].paragraphs == mars for q in ("q1", "q2", "q3"))
    assert by_id["q1"].answers == ["Mars"] and by_id["q1"].spans == [[0, 0, 4]]  # trailing space trimmed, deduped
    # the second answer of q2 points at the wrong offset: dropped with a message, the good one kept
    assert by_id["q2"].answers == ["the Red Planet"] and by_id["q2"].spans == [[0, 40, 54]]
    assert by_id["q3"].spans == [[1, 0, 6]] and by_id["q3"].extra == {"title": "Mars", "paragraph": 1}
    assert by_id["q6"].answers == [] and by_id["q6"].spans == []  # SQuAD 2.0 unanswerable
    assert "[article 0 'Mars', paragraph 1, question q4]: skipped (no_valid_answer)" in err
    assert "question q2]: dropped (offset_mismatch): answer 'Red Planet' at answer_start 3" in err
    assert "skipped no_valid_answer=1" in err and "answers lost offset_mismatch=2" in err
    # one article's context is stored once: the later records of the article name its context_id only
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert ["paragraphs" in line for line in lines] == [True, False, False, True, False]


def test_squad_article_slice_and_bad_files(tmp_path):
    src = tmp_path / "squad.json"
    src.write_text(json.dumps(SQUAD))
    _, records = convert("squad", src, tmp_path / "moon.jsonl", "--articles", "1:")
    assert [r.id for r in records] == ["q5", "q6"]
    src.write_text(json.dumps(SQUAD)[:-40])  # a truncated download
    out = tmp_path / "none.jsonl"
    code, text = run_cli("fairseq-clusterformer-qa-convert", "--format", "squad", src, out)
    assert code == 1 and f"error: {src}: not a SQuAD JSON file" in text
    assert not out.exists() and not list(tmp_path.glob(".none.jsonl.tmp*"))


def test_real_squad_v2_sample(tmp_path):
    out = tmp_path / "sq2.jsonl"
    text = run_ok(
        "fairseq-clusterformer-qa-convert",
        "--format",
        "squad",
        DATA / "squad" / "dev-v2.0.first5articles_san_mrc.json",
        out,
    )
    assert "kept 1407 examples; skipped none" in text
    records = [r for _, r in read_records(str(out), SkipLog())]
    assert len(records) == 1407 and sum(not r.answers for r in records) == 702
    assert len({r.context_id for r in records}) == 5
    for r in records:
        for p, s, e in r.spans:
            assert r.paragraphs[p][s:e] in r.answers


def write_gz_lines(path, objs, cut=None):
    data = "".join(json.dumps(o) + "\n" for o in objs).encode()
    packed = gzip.compress(data)
    path.write_bytes(packed[:cut] if cut else packed)


def test_quasart_joins_on_uid_and_finds_every_occurrence(tmp_path, capsys):
    questions = [
        {"uid": "t0q7", "question": "Which planet is called the Red Planet ?", "answer": "mars", "tags": ["1tok"]},
        {"uid": "t0q8", "question": "Who wrote Hamlet ?", "answer": "william shakespeare", "tags": []},
        {"uid": "t0q9", "question": "No passages ?", "answer": "x", "tags": []},
    ]
    contexts = [
        {
            "uid": "t0q8",
            "contexts": [
                [12.0, "Hamlet is a play by William Shakespeare ."],
                [3.5, "William  Shakespeare was English ."],
            ],
        },
        {
            "uid": "t0q7",
            "contexts": [
                [41.2, "Mars is often called the Red Planet ; MARS ."],
                [37.9, "The marshal saw mars rise ."],
                [1.0, "Nothing here ."],
            ],
        },
        {"uid": "t0qX", "contexts": [[1.0, "an orphan line"]]},
    ]
    write_gz_lines(tmp_path / "dev_questions.json.gz", questions)
    write_gz_lines(tmp_path / "dev_contexts.json.gz", contexts)
    written, records = convert(
        "quasart",
        tmp_path / "dev_questions.json.gz",
        tmp_path / "q.jsonl",
        "--contexts",
        tmp_path / "dev_contexts.json.gz",
    )
    assert written == 2
    by_id = {r.id: r for r in records}
    mars = by_id["t0q7"]
    # every whole-word, case-insensitive occurrence; "marshal" is not one
    assert mars.spans == [[0, 0, 4], [0, 38, 42], [1, 16, 20]]
    assert mars.answers == ["mars"] and mars.extra == {"tags": ["1tok"], "scores": [41.2, 37.9, 1.0]}
    # the answer is found in the first passage only: two spaces inside the second one are not a match
    assert by_id["t0q8"].spans == [[0, 20, 39]]
    err = capsys.readouterr().err
    assert "dev_contexts.json.gz:3: skipped (no_question): uid 't0qX'" in err
    assert "dev_questions.json.gz:3 [t0q9]: skipped (no_context)" in err

    # a truncated gzip stops the reading with a message, and what was read is still converted
    write_gz_lines(tmp_path / "cut.json.gz", contexts, cut=-30)
    written, _ = convert(
        "quasart", tmp_path / "dev_questions.json.gz", tmp_path / "q2.jsonl", "--contexts", tmp_path / "cut.json.gz"
    )
    assert "skipped (truncated_file)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="needs --contexts"):
        convert("quasart", tmp_path / "dev_questions.json.gz", tmp_path / "q3.jsonl")


def test_searchqa_text_and_json_forms(tmp_path, capsys):
    txt = tmp_path / "val.txt"
    txt.write_text(
        "<s> mars has two moons , phobos and deimos </s>  <s> phobos is the larger moon </s> ||| this planet 's 2 "
        "moons are phobos & deimos ||| mars\n"
        "no separators here\n"
        "<s> the thames flows through london </s>  <s> london bridge </s> ||| this city is on the thames ||| london\n"
    )
    written, records = convert("searchqa", txt, tmp_path / "s.jsonl")
    assert written == 2 and [r.id for r in records] == ["val-1", "val-3"]
    assert records[0].paragraphs == ["mars has two moons , phobos and deimos", "phobos is the larger moon"]
    assert records[0].question == "this planet 's 2 moons are phobos & deimos" and records[0].spans == [[0, 0, 4]]
    assert records[1].spans == [[0, 25, 31], [1, 0, 6]]
    assert "val.txt:2: skipped (malformed)" in capsys.readouterr().err

    folder = tmp_path / "json"
    folder.mkdir()
    question = {
        "id": 7,
        "category": "PLANETS",
        "air_date": "2004-12-31",
        "question": "It's the Red Planet",
        "value": "$200",
        "answer": "Mars",
        "round": "Jeopardy!",
        "show_number": "4680",
        "search_results": [
            {"title": "Mars", "url": "u", "snippet": "Mars, the red planet.", "related_links": None},
            {"title": "t", "url": "u", "snippet": None, "related_links": None},
        ],
    }
    (folder / "000007-4680_jeopardy_planets_200.json").write_text(json.dumps(question, indent=4))
    (folder / "000008-broken.json").write_text("{")
    written, records = convert("searchqa", folder, tmp_path / "j.jsonl")
    assert written == 1 and records[0].id == "7" and records[0].paragraphs == ["Mars, the red planet."]
    assert records[0].extra["category"] == "PLANETS" and records[0].spans == [[0, 0, 4]]
    assert "000008-broken.json: skipped (malformed)" in capsys.readouterr().err


NQ_TEXT = (
    "The Starry Night - Wikipedia <H1> The Starry Night </H1> <P> The Starry Night is an oil painting by "
    "Vincent van Gogh . </P> <Table> <Tr> <Td> Artist </Td> <Td> Vincent van Gogh </Td> </Tr> </Table>"
)


def nq_example(example_id=4417329003155830911, annotations=None):
    tokens = NQ_TEXT.split(" ")
    table = tokens.index("<Table>")
    return {
        "example_id": example_id,
        "question_text": "who painted the starry night",
        "document_url": "https://en.wikipedia.org/wiki/The_Starry_Night",
        "document_text": NQ_TEXT,
        "long_answer_candidates": [
            {"start_token": 10, "end_token": 24, "top_level": True},
            {"start_token": table, "end_token": len(tokens), "top_level": True},
            {"start_token": table + 1, "end_token": len(tokens) - 1, "top_level": False},
        ],
        "annotations": annotations
        if annotations is not None
        else [
            {
                "long_answer": {"start_token": 10, "end_token": 24, "candidate_index": 0},
                "short_answers": [{"start_token": 19, "end_token": 22}],
                "yes_no_answer": "NONE",
            }
        ],
    }


def test_nq_candidates_become_paragraphs(tmp_path):
    tokens = NQ_TEXT.split(" ")
    nested = {
        "long_answer": {"start_token": tokens.index("<Table>") + 1, "end_token": len(tokens) - 1, "candidate_index": 2},
        "short_answers": [],
        "yes_no_answer": "NONE",
    }
    null = {
        "long_answer": {"start_token": -1, "end_token": -1, "candidate_index": -1},
        "short_answers": [],
        "yes_no_answer": "NONE",
    }
    original = nq_example(5)
    original["document_tokens"] = [
        {"token": t, "start_byte": 0, "end_byte": 0, "html_token": t.startswith("<")}
        for t in original.pop("document_text").split(" ")
    ]
    lines = [nq_example(), nq_example(-3, [nested]), nq_example(4, [null, null]), original, {"example_id": 9}]
    src = tmp_path / "nq.jsonl.gz"
    write_gz_lines(src, lines)
    written, records = convert("nq", src, tmp_path / "nq.jsonl")
    assert written == 4
    short, table, none, from_original = records
    assert short.paragraphs == ["The Starry Night is an oil painting by Vincent van Gogh .", "Artist Vincent van Gogh"]
    assert short.answers == ["Vincent van Gogh"] and short.spans == [[0, 39, 55]]
    assert short.answer_type == "short" and short.long_answer == 0 and short.id == "4417329003155830911"
    candidate = short.extra["candidates"][0]
    assert candidate == {"index": 0, "start_token": 10, "end_token": 24, "words": [[11, 23]]}
    assert short.extra["candidates"][1]["words"] == [[27, 28], [30, 33]]  # the <Td> tags are left out
    # the nested candidate's long answer, as the paragraph to learn, is the top-level table that holds it
    assert table.long_answer == 1 and table.answer_type == "long" and table.answers == []
    # while the official gold, the annotated row's own span, stays with the record
    assert table.extra["long_answer_tokens"] == [tokens.index("<Table>") + 1, len(tokens) - 1]
    assert short.extra["long_answer_tokens"] == [10, 24] and none.extra["long_answer_tokens"] == [-1, -1]
    assert none.answer_type == "none" and none.long_answer == -1 and len(none.extra["annotations"]) == 2
    assert from_original.paragraphs == short.paragraphs and from_original.spans == short.spans
    # the malformed example keeps its id, for the prediction file that must hold every id
    last = json.loads((tmp_path / "nq.jsonl").read_text().splitlines()[-1])
    assert last == {"id": "9", "skipped": "malformed", "extra": {"example_id": 9, "annotations": []}}


def test_prepare_squad_recipe_on_local_files(tmp_path):
    """examples/qa/prepare_squad.sh with --data (no download): convert by article, train spm, binarise both splits."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "dev-v1.1.json").write_text(json.dumps(SQUAD))
    env = subprocess_env(MAX_CONTEXT_TOKENS="64")
    script = REPO / "examples" / "qa" / "prepare_squad.sh"
    args = ["--data", tmp_path / "src", "--split-dev", "1", "--out", tmp_path / "out", "--spm-vocab", "300"]
    proc = subprocess.run(["bash", script, *map(str, args)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((tmp_path / "out" / "bin" / "qa_config.json").read_text())
    assert config["tokenizer"] == "sentencepiece" and config["max_context_tokens"] == 64
    assert config["splits"]["train"]["examples"] == 3 and config["splits"]["valid"]["examples"] == 2
    assert (tmp_path / "out" / "spm" / "qa.model").is_file() and not list((tmp_path / "out").glob("download/*"))
