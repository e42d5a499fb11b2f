"""--tokenizer hf: the QA pipeline tokenises as an imported Hugging Face encoder does (uncased WordPiece, which is not
lossless) and cuts answers out of the original text through the tokeniser's character offsets.

The tokenizer is a small WordPiece uncased one trained here on the committed SQuAD slice (no download); its
directory follows fairseq-clusterformer-import-hf's output contract (tokenizer.json, dict.txt, hf_import.json).
"""

import functools
import json
import re
import string
from pathlib import Path

import numpy as np
import pytest
from fairseq import tasks
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_clusterformer.qa.data.answer_spans import ParagraphTokenizer, char_span_covering_tokens, token_char_offsets
from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit
from fairseq_clusterformer.qa.data.context_text import span_text_from_offsets
from fairseq_clusterformer.qa.data.hf_tokenizer import HFTokenizer, hf_dictionary
from fairseq_clusterformer.qa.data.records import SkipLog, read_records
from fairseq_clusterformer.qa.ops.metrics import squad_scores
from tests.conftest import run_cli, run_ok
from tests.test_qa_model import parse

SQUAD = Path(__file__).resolve().parent.parent / "examples" / "data" / "squad" / "dev-v1.1.json"
BERT_SPECIALS = {"<s>": "[CLS]", "<pad>": "[PAD]", "</s>": "[SEP]", "<unk>": "[UNK]", "<mask>": "[MASK]"}


ARTICLES = "8:10"  # Sky (United Kingdom) and Victoria (Australia): 232 questions, 47 paragraphs, a few seconds


TOKENIZER = Path(__file__).resolve().parent / "data" / "hf_tokenizer" / "tokenizer.json"


def train_tokenizer():
    """A WordPiece uncased tokenizer (1,500 pieces) trained on the test's SQuAD articles, specials at BERT's ids,
    truncating at 32 tokens. tokenizers' trainer breaks ties between equally frequent pairs in hash-map order, which
    differs between processes, so each call may give another vocabulary: the tests read the one committed in
    ``TOKENIZER`` (``python -m tests.test_hf_tokenizer`` trains and writes it again)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    data = json.loads(SQUAD.read_text(encoding="utf-8"))["data"][slice(*map(int, ARTICLES.split(":")))]
    texts = [p["context"] for a in data for p in a["paragraphs"]]
    texts += [q["question"] for a in data for p in a["paragraphs"] for q in p["qas"]]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)  # strips accents too, as uncased BERT does
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    specials = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=1500, special_tokens=specials))
    tokenizer.enable_truncation(32)
    return tokenizer


def make_hf_dir(root: Path) -> Path:
    """The committed WordPiece uncased tokenizer (``train_tokenizer``), laid out as an import writes it: the specials
    at BERT's ids (0, 100-103), dict.txt in HF id order without them, <mask> last. tokenizer.json keeps a truncation
    at 32 tokens, as all-MiniLM-L6-v2's does at 128, which the pipeline must switch off. Trained once and committed:
    a vocabulary trained in each test process made each run binarise other data, and a 40-update model trained on
    one of them answered none of its questions (tests/test_hf_export_pipeline.py, once in nine runs on 2026-12-08)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    out = root / "hf"
    out.mkdir()
    tokenizer.save(str(out / "tokenizer.json"))
    vocab = tokenizer.get_vocab()
    special_ids = {symbol: [token, vocab[token]] for symbol, token in BERT_SPECIALS.items()}
    skip = {hf_id for _, hf_id in special_ids.values()}
    lines = [f"{i} 1\n" for i in range(tokenizer.get_vocab_size()) if i not in skip]
    (out / "dict.txt").write_text("".join(lines) + "<mask> 1\n")
    info = {"model_type": "bert", "source": "test", "special_tokens": special_ids, "do_lower_case": True}
    (out / "hf_import.json").write_text(json.dumps(info))
    return out


@functools.lru_cache
def source_tokenizer(hf_dir: Path):
    """The source tokenizer (untruncated) and HF id -> fairseq id read from the files themselves: dict.txt line n is
    fairseq id 4 + n (after fairseq's <s> <pad> </s> <unk>), a special takes its fairseq symbol's id."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    lines = (hf_dir / "dict.txt").read_text().split("\n")
    mapping = {int(line.split()[0]): 4 + n for n, line in enumerate(lines) if line[:1].isdigit()}
    builtin = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    info = json.loads((hf_dir / "hf_import.json").read_text())
    mapping.update({hf_id: builtin[s] for s, (_, hf_id) in info["special_tokens"].items() if s in builtin})
    return tokenizer, mapping


@functools.cache
def source_ids(hf_dir: Path, text: str) -> list[int]:
    tokenizer, mapping = source_tokenizer(hf_dir)
    return [mapping[i] for i in tokenizer.encode(text, add_special_tokens=False).ids]


@pytest.fixture(scope="module")
def hf_data(tmp_path_factory):
    """The ARTICLES as article and paragraph records, the article ones binarised as train and valid split, through
    the real console scripts (c)."""
    root = tmp_path_factory.mktemp("hf_tok")
    hf_dir = make_hf_dir(root)
    for unit in ("article", "paragraph"):
        run_ok("fairseq-clusterformer-qa-convert", "--format", "squad", SQUAD, root / f"{unit}.jsonl", "--articles",
               ARTICLES, "--context-unit", unit)  # fmt: skip
    jsonl = root / "article.jsonl"
    run_ok("fairseq-clusterformer-qa-binarize", "--tokenizer", "hf", "--hf-dir", hf_dir, "--train", jsonl,
           "--valid", jsonl, "--destdir", root / "bin", "--max-context-tokens", "100000")  # fmt: skip
    return hf_dir, root / "bin", root


def test_binarised_ids_are_the_source_tokenizers(hf_data):
    """(a) + (c): every question and every paragraph of the binarised data is the source tokenizer's encoding, mapped
    through dict.txt, paragraph tokens between; whole contexts, although tokenizer.json truncates at 32."""
    hf_dir, data_dir, root = hf_data
    records = {r.id: r for _, r in read_records(str(root / "article.jsonl"), SkipLog())}
    for split_name in ("train", "valid"):
        split = QABinarizedSplit(str(data_dir), split_name)
        assert len(split) == len(records)
        p = split.paragraph_id
        longest = 0
        for i in range(len(split)):
            example, record = split[i], records[split.metas[i]["id"]]
            assert example.question.tolist() == source_ids(hf_dir, record.question.strip())
            expected = [t for text in record.paragraphs for t in [p, *source_ids(hf_dir, text)]]
            assert example.context.tolist() == expected
            longest = max(longest, len(expected))
        assert longest > 1000  # far over the file's truncation
        assert split.config["tokenizer"] == "hf" and split.config["splits"][split_name]["cut_at_answers"] is False


def normalize(text: str) -> str:
    """SQuAD's answer normalisation (evaluate-v1.1.py)."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def test_every_gold_answer_maps_to_tokens_and_back_to_its_characters(hf_data):
    """(b): each gold answer's characters map to the tokens covering them, whose offsets give back exactly the
    answer's characters, except where an answer edge falls inside a WordPiece token (an annotation that cuts a word):
    then the text is the answer grown to whole tokens. Counted; the official EM / F1 of the gold spans stays 100 / 100
    when an answer of the question maps back exactly."""
    hf_dir, _, root = hf_data
    tokenizer = HFTokenizer(str(hf_dir), hf_dictionary(str(hf_dir)))
    paragraphs = ParagraphTokenizer(tokenizer)
    answers = exact = inside = 0
    golds, best = {}, {}
    for _, record in read_records(str(root / "paragraph.jsonl"), SkipLog()):
        golds[record.id] = record.answers
        for p, start, end in record.spans:
            text = record.paragraphs[p]
            tokens = paragraphs.tokenize(text)
            first, last = char_span_covering_tokens(text, tokens, start, end)
            offsets = np.concatenate([np.zeros((len(tokens.ids), 1), dtype=np.int64), token_char_offsets(tokens)], 1)
            back = span_text_from_offsets([text], offsets, first, last)
            answers += 1
            if back == text[start:end].strip():
                exact += 1
                best[record.id] = back
                continue
            chars = token_char_offsets(tokens)
            cut_word = any(s < edge < e for s, e in chars[first : last + 1] for edge in (start, end))
            assert cut_word and text[start:end].strip() in back, (text[start:end], back)
            inside += 1
            best.setdefault(record.id, back)
    assert exact + inside == answers and inside < 0.01 * answers, (exact, inside, answers)
    scores = squad_scores(golds, best)
    assert scores["exact_match"] == scores["f1"] == 100.0, scores


def test_task_cuts_the_answer_out_of_the_original_text_of_a_truncated_context(hf_data):
    """The task's answer text (what validation and qa-predict score) for every gold span of the binarised training
    split, whose whole-article contexts are truncated (gold paragraphs first, so paragraphs move): the original
    characters, case and accents included, whatever the tokenizer normalised."""
    data_dir = hf_data[1]
    split = QABinarizedSplit(str(data_dir), "train")
    limit = int(np.median(split.context_sizes)) // 2
    task = tasks.setup_task(convert_namespace_to_omegaconf(parse(data_dir, "--max-context-train", limit)).task)
    dataset = task.load_dataset("train")
    assert any(item.cut is not None and not item.cut.is_prefix for item in dataset.items)
    golds, texts, cased = {}, {}, 0
    for item in dataset.items:
        meta = split.metas[item.index]
        golds[meta["id"]] = meta["answers"]
        for start, end in item.spans:
            text = task.answer_text("train", item.index, start, end)
            texts.setdefault(meta["id"], text)
            if any(normalize(text) == normalize(a) for a in meta["answers"]):
                texts[meta["id"]] = text
            cased += text != text.lower()
    assert cased > 0  # the lower-casing tokenizer did not lower-case the answers
    assert squad_scores(golds, texts)["exact_match"] == 100.0


def test_bad_hf_dir_and_unmapped_tokens_name_what_is_wrong(tmp_path, hf_data):
    hf_dir = hf_data[0]
    with pytest.raises(FileNotFoundError, match="--hf-dir .* holds no tokenizer.json: give a directory written by"):
        HFTokenizer(str(tmp_path), Dictionary())
    code, out = run_cli("fairseq-clusterformer-qa-binarize", "--tokenizer", "hf", "--valid",
                        hf_data[2] / "article.jsonl", "--destdir", tmp_path / "bin")  # fmt: skip
    assert code != 0 and "--tokenizer hf needs --hf-dir" in out
    short = tmp_path / "short"
    short.mkdir()
    for name in ("tokenizer.json", "hf_import.json"):
        (short / name).write_text((hf_dir / name).read_text())
    (short / "dict.txt").write_text("".join((hf_dir / "dict.txt").read_text().splitlines(True)[:-50]))
    with pytest.raises(ValueError, match="dict.txt has no symbol for 49 of the tokenizer's"):
        HFTokenizer(str(short), hf_dictionary(str(short)))


if __name__ == "__main__":
    TOKENIZER.parent.mkdir(parents=True, exist_ok=True)
    train_tokenizer().save(str(TOKENIZER))
    print(f"wrote {TOKENIZER}")
