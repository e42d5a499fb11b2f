"""fairseq-clusterformer-export-hf: the exported model computes the fairseq model's start / end logits (float32, to
1e-5) on long multi-paragraph contexts, batched and padded, for every layer kind and mode; bad input is named.

The models are tiny and random (weights drawn at a scale where a wrong mapping shows), built in the test on data
tokenised by a WordPiece tokeniser laid out as a Hugging Face import (``test_hf_tokenizer.make_hf_dir``).
"""

import json
import re
import shutil

import pytest
import torch
from fairseq import tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf

from tests.hf_sources import import_transformers

try:
    transformers = import_transformers()
except pytest.skip.Exception as e:
    pytest.skip(str(e), allow_module_level=True)
pytest.importorskip("transformers", minversion="5.0.0")  # configuration.OLDEST_TRANSFORMERS

from fairseq_clusterformer.qa.hf_model.configuration import check_transformers  # noqa: E402
from fairseq_clusterformer.qa.hf_model.export import HFExportError, export_hf  # noqa: E402
from fairseq_clusterformer.qa.hf_model.modeling import ClusterFormerForQuestionAnswering  # noqa: E402
from fairseq_clusterformer.qa.hub_loading import load_hub  # noqa: E402
from tests.conftest import run_cli, run_ok  # noqa: E402
from tests.data.qa_model.synthetic import write_records  # noqa: E402
from tests.hf_sources import make_roberta, randomize  # noqa: E402
from tests.test_hf_tokenizer import make_hf_dir  # noqa: E402
from tests.test_qa_model import parse  # noqa: E402

KINDS = {
    "none": ["--long-range-layer", "none"],
    "cluster": ["--long-range-layer", "cluster"],
    "lsh": ["--long-range-layer", "lsh"],
    "sparse": ["--long-range-layer", "sparse"],
    "one-layer": ["--long-range-layer", "cluster", "--long-range-layers", "3"],
    "hybrid": ["--long-range-layer", "cluster", "--long-range-mode", "hybrid"],
    "lsh-hybrid": ["--long-range-layer", "lsh", "--long-range-mode", "hybrid", "--long-range-layers", "4"],
}
TOLERANCE = 1e-5


def binarize_hf(root):
    """Synthetic multi-paragraph records (2-6 paragraphs, 100-400 tokens: many windows of 32) binarised with an
    imported WordPiece tokeniser (--tokenizer hf) under ``root``."""
    import_transformers()
    hf_dir = make_hf_dir(root)
    write_records(root / "train.jsonl", 240, 1, (2, 6))
    write_records(root / "valid.jsonl", 40, 2, (2, 6))
    run_ok("fairseq-clusterformer-qa-binarize", "--tokenizer", "hf", "--hf-dir", hf_dir, "--train",
           root / "train.jsonl", "--valid", root / "valid.jsonl", "--destdir", root / "bin")  # fmt: skip
    return root


@pytest.fixture(scope="module")
def hf_data(tmp_path_factory):
    return binarize_hf(tmp_path_factory.mktemp("hf_export"))


def save_checkpoint(data, path, *flags, seed=0):
    """A random clusterformer_qa model of the tiny architecture as fairseq's checkpoint file holds one."""
    cfg = convert_namespace_to_omegaconf(parse(data, *flags))
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    randomize(model, seed)
    history = {"criterion_name": "clusterformer_qa", "optimizer_name": "adam", "lr_scheduler_state": {},
               "num_updates": 0}  # fmt: skip
    state = {"cfg": OmegaConf.to_container(cfg, resolve=True), "model": model.state_dict(), "args": None,
             "optimizer_history": [history], "last_optimizer_state": None,
             "extra_state": {"train_iterator": None}}  # fmt: skip
    torch.save(state, path)
    return path


def pair_batch(hub, hf_model, records):
    """The fairseq model's inputs (question, context: B x Q, B x T) and the same rows as the exported tokenizer's
    pair encoding in Hugging Face ids (input_ids, attention_mask: B x L), right-padded."""
    encoded = [hub.encode(r["question"], "\n\n".join(r["paragraphs"])) for r in records]
    to_hf = torch.full((hf_model.config.fairseq_vocab_size,), -1, dtype=torch.long)
    known = hf_model.hf_to_fairseq >= 0
    to_hf[hf_model.hf_to_fairseq[known]] = torch.arange(len(known))[known]
    bos, eos = hub.task.dictionary.bos(), hub.task.dictionary.eos()
    rows = [torch.cat([torch.tensor([bos]), e.question, torch.tensor([eos, eos]), e.context, torch.tensor([eos])])
            for e in encoded]  # fmt: skip
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), hf_model.config.pad_token_id)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)], mask[i, : len(row)] = to_hf[row], 1
    pad = hub.task.dictionary.pad()
    question = torch.nn.utils.rnn.pad_sequence([e.question for e in encoded], batch_first=True, padding_value=pad)
    context = torch.nn.utils.rnn.pad_sequence([e.context for e in encoded], batch_first=True, padding_value=pad)
    return question, context, input_ids, mask


@pytest.mark.parametrize("kind", KINDS)
def test_the_exported_model_computes_the_fairseq_logits(hf_data, tmp_path, kind):
    checkpoint = save_checkpoint(hf_data / "bin", tmp_path / "checkpoint.pt", *KINDS[kind])
    export_hf(str(checkpoint), str(tmp_path / "export"))
    hub = load_hub(str(checkpoint), cpu=True)
    hf_model = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path / "export", local_files_only=True).eval()
    records = [json.loads(line) for line in (hf_data / "valid.jsonl").read_text().splitlines()[:6]]
    question, context, input_ids, mask = pair_batch(hub, hf_model, records)
    assert context.size(1) > 8 * hub.model.args.window_size  # whole multi-paragraph contexts, many windows
    with torch.no_grad():
        expected = hub.model(question=question, context=context)
        out = hf_model(input_ids=input_ids, attention_mask=mask)
    first = question.ne(hub.task.dictionary.pad()).sum(dim=1) + 3  # B, after <s> question </s></s>
    worst = 0.0
    for row in range(len(records)):
        n = int(context[row].ne(hub.task.dictionary.pad()).sum())
        for name, got in (("start", out.start_logits), ("end", out.end_logits)):
            ours = got[row, first[row] : first[row] + n]
            worst = max(worst, float((ours - expected[name][row, :n]).abs().max()))
            outside = torch.ones(input_ids.size(1), dtype=torch.bool)
            outside[first[row] : first[row] + n] = False
            assert bool((got[row, outside] == torch.finfo(got.dtype).min).all())
    print(f"{kind}: max |logit difference| {worst:.2e}")
    assert worst <= TOLERANCE, f"{kind}: exported logits differ from fairseq's by {worst}"
    assert float(expected["start"][0].std()) > 0.1  # logits that tell positions apart, not a flat row
    hf_model.load_state_dict(hf_model.state_dict())
    assert not hf_model.derived_ready  # a later load derives the cluster groups and LSH directions again
    if kind == "none":
        # the exported tokenizer's own pair encoding is the model's input (one paragraph: one <p>, at its start)
        tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path / "export", local_files_only=True)
        one = {**records[0], "paragraphs": records[0]["paragraphs"][:1]}
        _, _, ids, _ = pair_batch(hub, hf_model, [one])
        assert tokenizer(one["question"], one["paragraphs"][0])["input_ids"] == ids[0].tolist()
        longest = int(mask.sum(dim=1).argmax())
        with pytest.raises(ValueError, match=f"row {longest} of input_ids is not '<s> question </s></s> context"):
            hf_model(input_ids=input_ids[:, :-1], attention_mask=mask[:, :-1])  # the longest row cut
        with pytest.raises(NotImplementedError, match="training through transformers is not supported"):
            hf_model(input_ids=input_ids, attention_mask=mask, start_positions=first, end_positions=first)


@pytest.fixture(scope="module")
def checkpoint(hf_data, tmp_path_factory):
    return save_checkpoint(hf_data / "bin", tmp_path_factory.mktemp("bad_inputs") / "checkpoint.pt", *KINDS["cluster"])


def test_a_checkpoint_that_is_not_a_qa_model_is_named(checkpoint, tmp_path):
    state = torch.load(checkpoint, weights_only=False)
    model, task = state["cfg"]["model"], state["cfg"]["task"]  # the model's arguments are a Namespace (RoBERTa's)
    model._name = model.arch = "clusterformer_lm_tiny"
    task["_name"] = "clusterformer_lm"
    torch.save(state, tmp_path / "lm.pt")
    code, out = run_cli("fairseq-clusterformer-export-hf", tmp_path / "lm.pt", tmp_path / "out")
    assert code == 1 and "is not a question-answering checkpoint (--arch clusterformer_lm_tiny" in out, out
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(HFExportError, match="notes.txt cannot be read as a fairseq checkpoint"):
        export_hf(str(tmp_path / "notes.txt"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_an_out_dir_holding_other_files_is_never_written_over(checkpoint, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(HFExportError, match=r"holds config.json, which no earlier export wrote"):
        export_hf(str(checkpoint), str(out))
    assert (out / "config.json").read_text() == "{}" and sorted(p.name for p in out.iterdir()) == ["config.json"]
    with pytest.raises(HFExportError, match="is a file, not a folder"):
        export_hf(str(checkpoint), str(out / "config.json"))
    export_hf(str(checkpoint), str(tmp_path / "export"))
    export_hf(str(checkpoint), str(tmp_path / "export"))  # an earlier export's files are its to replace
    assert not [p for p in (tmp_path / "export").iterdir() if p.name.startswith(".")]  # no temporary left


def test_the_model_card_gives_the_recipes_held_out_scores_where_it_scored_the_checkpoint(checkpoint, tmp_path):
    run = tmp_path / "article_cluster_seed1"  # a cpu_pretrained.sh run folder, its scoring's summary beside
    run.mkdir()
    shutil.copy(checkpoint, run / "checkpoint_last.pt")
    export_hf(str(run / "checkpoint_last.pt"), str(tmp_path / "unscored"))
    card = (tmp_path / "unscored" / "README.md").read_text()
    assert "records no validation score" in card and "Scored by its recipe" not in card
    assert re.search(r"learning rate [0-9.e-]+; exported", card), card  # a number, not a list
    row = {"exact_match": 26.9365, "f1": 37.2211, "questions": 1589, "answered": 1589}
    (run / "summary.json").write_text(json.dumps({run.name: row, "random_span": {"exact_match": 0.2}}))
    export_hf(str(run / "checkpoint_last.pt"), str(tmp_path / "scored"))
    card = (tmp_path / "scored" / "README.md").read_text()
    assert "Scored by its recipe on 1589 held-out questions: **EM 26.94, F1 37.22**" in card
    origin = json.loads((tmp_path / "scored" / "config.json").read_text())["exported_from"]
    assert origin["recipe_scores"]["f1"] == 37.22


def test_a_tokenizer_that_cannot_export_is_refused_with_the_reason(checkpoint, hf_data, tmp_path):
    data = tmp_path / "bin"
    shutil.copytree(hf_data / "bin", data)
    config = json.loads((data / "qa_config.json").read_text())
    (data / "qa_config.json").write_text(json.dumps({**config, "tokenizer": "sentencepiece"}))
    with pytest.raises(HFExportError, match=r"'sentencepiece' tokeniser, which does not export: only a Hugging Face"):
        export_hf(str(checkpoint), str(tmp_path / "out"), str(data))
    assert not (tmp_path / "out").exists()


def test_an_older_transformers_is_named():
    with pytest.raises(ImportError, match=r"transformers 4.46.0 is installed; .* needs transformers >= 5.0.0"):
        check_transformers("4.46.0")


def test_a_roberta_import_exports_with_its_byte_level_tokenizer(tmp_path):
    """A byte-level BPE RoBERTa imported by the real console script, fine-tuned from (here: random weights over it):
    the exported tokenizer's pair encoding is the model's input, the logits are fairseq's, and the pipeline, built
    in this process, answers as the hub does (byte-level offsets, trimmed of their spaces)."""
    from fairseq_clusterformer.qa.hf_model.pipeline import ClusterFormerQAPipeline

    run_ok("fairseq-clusterformer-import-hf", make_roberta(tmp_path), tmp_path / "import")
    write_records(tmp_path / "valid.jsonl", 6, 3, (2, 3))
    run_ok("fairseq-clusterformer-qa-binarize", "--tokenizer", "hf", "--hf-dir", tmp_path / "import", "--train",
           tmp_path / "valid.jsonl", "--valid", tmp_path / "valid.jsonl", "--destdir", tmp_path / "bin")  # fmt: skip
    flags = ["--roberta-path", tmp_path / "import", "--max-question-tokens", "28", "--window-size", "32",
             "--window-stride", "24", "--long-range-layer", "cluster", "--long-range-layers", "2"]  # fmt: skip
    checkpoint = save_checkpoint(tmp_path / "bin", tmp_path / "checkpoint.pt", *flags)
    export_hf(str(checkpoint), str(tmp_path / "export"))
    hub = load_hub(str(checkpoint), cpu=True)
    hf_model = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path / "export", local_files_only=True).eval()
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path / "export", local_files_only=True)
    records = [json.loads(line) for line in (tmp_path / "valid.jsonl").read_text().splitlines()]
    question, context, input_ids, mask = pair_batch(hub, hf_model, records)
    one = {**records[0], "paragraphs": records[0]["paragraphs"][:1]}
    pair = tokenizer(one["question"], one["paragraphs"][0])["input_ids"]
    assert pair == pair_batch(hub, hf_model, [one])[2][0].tolist()
    with torch.no_grad():
        expected = hub.model(question=question, context=context)["start"]
        got = hf_model(input_ids=input_ids, attention_mask=mask).start_logits
    first = question.ne(hub.task.dictionary.pad()).sum(dim=1) + 3
    for row in range(len(records)):
        n = int(context[row].ne(hub.task.dictionary.pad()).sum())
        assert torch.allclose(got[row, first[row] : first[row] + n], expected[row, :n], atol=TOLERANCE, rtol=0)
    qa = ClusterFormerQAPipeline(model=hf_model, tokenizer=tokenizer)
    for r in records:
        text = "\n\n".join(r["paragraphs"])
        theirs = hub.answer(r["question"], text)[0]
        ours = qa(question=r["question"], context=text)
        assert (ours["answer"], ours["start"], ours["end"]) == (theirs.text, theirs.start, theirs.end)
        # top_k > 1: qa-ask's distinct spans by default, its overlapping ones when asked
        for overlapping in (False, True):
            theirs = hub.answer(r["question"], text, top_k=3, overlapping=overlapping)
            ours = qa(question=r["question"], context=text, top_k=3, overlapping=overlapping)
            assert [(a["answer"], a["start"], a["end"]) for a in ours] == [(a.text, a.start, a.end) for a in theirs]
