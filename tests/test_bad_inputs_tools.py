"""Bad input to the plug-in's own console scripts (QA data tools, prediction, long-range and cluster analysis), run
for real: every case ends with a non-zero status and a message naming the flag, file or line at fault, loses no
valid record and leaves no file behind."""

import json
import random

import pytest
import torch

from fairseq_clusterformer.refresh import memory_bank
from fairseq_clusterformer.refresh.memory_bank import MemoryBank
from tests.conftest import PACKAGE, REPO, SLICE, TINY_LM_TRAIN, run_cli, run_ok
from tests.data.qa_model.synthetic import make_record, shared_data

pytestmark = pytest.mark.e2e

QA_TRAIN = [
    "--user-dir", PACKAGE, "--task", "clusterformer_qa", "--arch", "clusterformer_qa_tiny",
    "--criterion", "clusterformer_qa", "--max-question-tokens", "40", "--optimizer", "adam", "--lr", "1e-3",
    "--batch-size", "4", "--memory-size", "2000", "--kmeans-backend", "torch", "--cpu", "--num-workers", "0",
    "--no-epoch-checkpoints", "--max-update", "1",
]  # fmt: skip
TRANSFORMER_LM = [
    "--task", "language_modeling", "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
    "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "64",
    "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "4", "--num-workers", "0", "--no-epoch-checkpoints",
    "--max-update", "1",
]  # fmt: skip


def failure(*args):
    code, out = run_cli(*args)
    assert code != 0, out[-3000:]
    return out


def hidden_temporaries(folder):
    return sorted(p.name for p in folder.glob(".*.tmp-*"))


@pytest.fixture(scope="module")
def checkpoints(lm_data, tmp_path_factory):
    """checkpoint_last.pt of a clusterformer_lm, a fairseq transformer_lm and a clusterformer_qa model (1 update)."""
    root = tmp_path_factory.mktemp("bad_tools_ckpt")
    run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, "--memory-size", "2000", "--no-epoch-checkpoints",
           "--max-update", "1", "--save-dir", root / "lm")  # fmt: skip
    run_ok("fairseq-train", lm_data, *TRANSFORMER_LM, "--save-dir", root / "transformer_lm")
    run_ok("fairseq-train", shared_data(tmp_path_factory), *QA_TRAIN, "--save-dir", root / "qa")
    return {kind: root / kind / "checkpoint_last.pt" for kind in ("lm", "transformer_lm", "qa")}


def binarize(qa_data, destdir, *splits):
    """qa-binarize with the shared data set's sentencepiece model (so that the QA checkpoint reads its output)."""
    spm = qa_data.parent / "spm" / "qa.model"
    flags = ["--tokenizer", "sentencepiece", "--sentencepiece-model", spm, *splits, "--destdir", destdir]
    return run_cli("fairseq-clusterformer-qa-binarize", *flags)


def test_a_bad_byte_costs_its_own_line_only_and_is_reported_down_to_the_scores(checkpoints, tmp_path_factory):
    qa_data = shared_data(tmp_path_factory)
    root = tmp_path_factory.mktemp("bad_byte")
    rng = random.Random(5)
    lines = [json.dumps(make_record(rng, i, 2)).encode() for i in range(55)]
    # one byte of line 50 is not UTF-8 (a flipped bit in a letter of its question)
    lines[49] = lines[49].replace(b"what is", b"wh\xe1t is", 1)
    assert b"\xe1" in lines[49]
    src = root / "valid.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")

    code, out = binarize(qa_data, root / "bin", "--valid", src)
    assert code == 0, out[-3000:]
    assert f"{src}:50: skipped (malformed): not valid UTF-8 (byte 0xe1 at byte" in out
    assert f"kept 54 examples; skipped malformed=1 (first at {src}:50)" in out
    config = json.loads((root / "bin" / "qa_config.json").read_text())["splits"]["valid"]
    assert config["examples"] == 54 and config["skipped"] == {"malformed": 1}
    metas = [json.loads(line) for line in (root / "bin" / "valid.meta.jsonl").read_text().splitlines()]
    assert [m["id"] for m in metas] == [f"syn{i}" for i in range(55) if i != 49]  # every valid record, in order

    # the score says that it covers 54 of the 55 records, and which line is missing
    args = ["--path", checkpoints["qa"], "--split", "valid", "--output", root / "pred.json", "--cpu"]
    out = run_ok("fairseq-clusterformer-qa-predict", root / "bin", *args)
    assert f"| valid: 1 record(s) of {src} are not in these scores: skipped (malformed=1 (first at {src}:50))" in out
    assert len(json.loads((root / "pred.json").read_text())) == 54


def test_a_language_model_given_to_qa_predict_is_named_as_one(checkpoints, tmp_path_factory, tmp_path):
    qa_data = shared_data(tmp_path_factory)
    lm = checkpoints["lm"]
    out = failure("fairseq-clusterformer-qa-predict", qa_data, "--path", lm, "--output", tmp_path / "p.json", "--cpu")
    assert f"--path {lm} is a Cluster-Former language-model (clusterformer_lm) checkpoint" in out
    assert "needs a clusterformer_qa checkpoint" in out and "dictionary" not in out


def test_a_qa_model_given_to_longrange_is_named_as_one(checkpoints, lm_data):
    qa = checkpoints["qa"]
    out = failure("fairseq-clusterformer-longrange", lm_data, "--path", qa, "--reach", "10", "--cpu",
                  "--tokens-per-sample", "64", "--context-window", "32")  # fmt: skip
    assert f"--path {qa} is a question-answering (clusterformer_qa) checkpoint (--arch clusterformer_qa_tiny" in out
    assert "needs a language-model checkpoint" in out


@pytest.mark.parametrize(
    "kind, arch", [("transformer_lm", "--arch transformer_lm, --task language_modeling"), ("qa", "clusterformer_qa")]
)
def test_inspect_names_the_arch_it_got_and_the_one_it_needs(checkpoints, lm_data, tmp_path, kind, arch):
    path = checkpoints[kind]
    where = ["--data", lm_data, "--document", SLICE / "test.txt", "--png", tmp_path / "x.png"]
    out = failure("fairseq-clusterformer-inspect", "--path", path, *where)
    assert f"inspect: --path {path} is a " in out and arch in out
    assert "needs a clusterformer_lm checkpoint (--arch clusterformer_lm_*)" in out
    assert "Traceback" not in out and not (tmp_path / "x.png").exists()


def test_a_memory_bank_too_large_to_allocate_names_memory_size_and_its_bytes(lm_data, tmp_path):
    huge = 10**12  # 10^12 states x 64 dims x 4 bytes: more than any machine's memory
    out = failure("fairseq-train", lm_data, *TINY_LM_TRAIN, "--memory-size", str(huge), "--max-update", "1",
                  "--no-epoch-checkpoints", "--save-dir", tmp_path / "s")  # fmt: skip
    assert f"--memory-size {huge}: the memory bank of each long-range layer holds {huge} states x 64 dims" in out
    assert "= 256,000,000,000,000 bytes" in out and "lower --memory-size" in out


def test_an_allocation_the_free_memory_check_let_through_still_names_memory_size(monkeypatch):
    monkeypatch.setattr(memory_bank, "free_memory", lambda device: None, raising=False)  # free memory unknown
    bank = MemoryBank(10**13)  # 2.56e15 bytes at 64 dims: more than any address space holds
    with pytest.raises(ValueError, match="--memory-size 10000000000000: .* which cpu could not allocate"):
        bank.add(torch.randn(3, 64))


def test_an_output_path_that_is_a_directory_is_named_and_leaves_nothing(checkpoints, lm_data, tmp_path_factory):
    qa_data = shared_data(tmp_path_factory)
    root = tmp_path_factory.mktemp("output_dirs")
    taken = root / "taken"
    taken.mkdir()
    squad = REPO / "examples" / "data" / "squad" / "dev-v1.1.json"
    out = failure("fairseq-clusterformer-qa-convert", "--format", "squad", squad, taken)
    assert f"fairseq-clusterformer-qa-convert: error: OUTPUT {taken}: is a directory" in out
    out = failure("fairseq-clusterformer-qa-predict", qa_data, "--path", checkpoints["qa"], "--output", taken, "--cpu")
    assert f"fairseq-clusterformer-qa-predict: error: --output {taken}: is a directory" in out
    out = failure("fairseq-clusterformer-longrange", lm_data, "--path", checkpoints["lm"], "--json", taken)
    assert f"--json {taken}: is a directory" in out
    where = ["--data", lm_data, "--document", SLICE / "test.txt"]
    out = failure("fairseq-clusterformer-inspect", "--path", checkpoints["lm"], *where, "--png", taken)
    assert f"inspect: --png {taken}: is a directory" in out
    assert "Traceback" not in out
    assert hidden_temporaries(root) == [] and list(taken.iterdir()) == []


def test_an_empty_split_writes_nothing(tmp_path_factory):
    qa_data = shared_data(tmp_path_factory)
    root = tmp_path_factory.mktemp("empty_split")
    (root / "empty.jsonl").write_text("\n")
    train = qa_data.parent / "train.jsonl"
    code, out = binarize(qa_data, root / "new" / "bin", "--train", train, "--valid", root / "empty.jsonl")
    assert code != 0 and f"{root / 'empty.jsonl'}: no usable example" in out, out[-3000:]
    assert not (root / "new").exists()  # not even the folders it would have made
    # a folder that holds other work keeps exactly what it held
    kept = root / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    code, out = binarize(qa_data, kept, "--train", train, "--valid", root / "empty.jsonl")
    assert code != 0 and sorted(p.name for p in kept.iterdir()) == ["notes.txt"], out[-3000:]
