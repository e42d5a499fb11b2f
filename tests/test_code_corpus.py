"""The source-code corpus builder (examples/code): deterministic, disjoint splits by content, the recorded hashes,
per-file placeholders for file-local names, and examples/code/prepare.sh end to end on a folder of .py files."""

import hashlib
import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO, subprocess_env

BUILD = REPO / "examples" / "code" / "build_corpus.py"
PREPARE = REPO / "examples" / "code" / "prepare.sh"


def make_sources(folder, files=40):
    """Modules sharing library names (``numpy``, ``total``) and each with names of its own, plus one copy of a file
    under another name (the copy must land in the same split) and one file Python cannot tokenize."""
    folder.mkdir()
    for i in range(files):
        (folder / f"mod{i}.py").write_text(
            f"import numpy\n\n\ndef helper_{i}(values):\n    # a comment\n    total = numpy.sum(values)\n"
            f"    local_{i} = total * {i}\n    return local_{i} + len('key')\n",
            encoding="utf-8",
        )
    (folder / "copy_of_mod3.py").write_bytes((folder / "mod3.py").read_bytes())
    (folder / "broken.py").write_text("def f(:\n    '''never closed\n", encoding="utf-8")
    return folder


def build(sources, out, *flags):
    return subprocess.run(
        [sys.executable, str(BUILD), "--data", str(sources), "--out", str(out), "--min-files", "5", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.fixture
def corpus(tmp_path):
    sources = make_sources(tmp_path / "src")
    proc = build(sources, tmp_path / "out", "--valid-percent", "20", "--test-percent", "20")
    assert proc.returncode == 0, proc.stdout
    return sources, tmp_path / "out"


def test_splits_are_disjoint_by_content_and_listed(corpus):
    sources, out = corpus
    listing = [line.split("\t") for line in (out / "files.tsv").read_text().splitlines()[1:]]
    digests = [digest for _, digest, _, _ in listing]
    assert len(digests) == len(set(digests)) == 40  # the copy of mod3.py is dropped, broken.py skipped
    contents = {hashlib.sha256(p.read_bytes()).hexdigest() for p in sources.glob("mod*.py")}
    assert set(digests) == contents
    for split in ("train", "valid", "test"):
        lines = (out / f"{split}.txt").read_text().splitlines()
        assert len(lines) == sum(s == split for s, *_ in listing) > 0  # one line per file, every split used


def test_the_manifest_records_each_split_hash_and_the_skipped_file(corpus):
    _, out = corpus
    manifest = json.loads((out / "corpus.json").read_text())
    for split in ("train", "valid", "test"):
        assert manifest["splits"][split]["sha256"] == hashlib.sha256((out / f"{split}.txt").read_bytes()).hexdigest()
    assert [s["file"] for s in manifest["skipped"]] == ["data:broken.py"]
    assert manifest["python"] and manifest["settings"]["min_files"] == 5


def test_building_twice_gives_the_same_bytes(corpus, tmp_path):
    sources, out = corpus
    proc = build(sources, tmp_path / "again", "--valid-percent", "20", "--test-percent", "20")
    assert proc.returncode == 0, proc.stdout
    for name in ("train.txt", "valid.txt", "test.txt", "files.tsv"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes()


def test_shared_names_are_kept_and_file_local_names_become_placeholders(corpus):
    _, out = corpus
    line = (out / "train.txt").read_text().splitlines()[0].split()
    # numpy, total and len occur in every file; helper_i and local_i in one file each
    assert line[:3] == ["import", "numpy", "<nl>"]
    assert "total" in line and "len" in line and not any(t.startswith(("helper_", "local_")) for t in line)
    assert line[line.index("def") + 1] == "<v0>"  # helper_i, the first local name
    local = [t for t in line if t == "<v1>"]  # local_i (values is in every file): assigned, then read
    assert len(local) == 2 and "<indent>" in line and "<dedent>" in line and "#" not in " ".join(line)
    assert "'key'" in line  # a short string in every file is a word of its own


def test_bad_flags_name_the_flag(tmp_path):
    proc = build(tmp_path / "missing", tmp_path / "out")
    assert proc.returncode != 0 and "--data" in proc.stdout
    (tmp_path / "empty").mkdir()
    proc = build(tmp_path / "empty", tmp_path / "out")
    assert proc.returncode != 0 and "no .py files" in proc.stdout
    proc = build(make_sources(tmp_path / "src"), tmp_path / "out", "--valid-percent", "60", "--test-percent", "40")
    assert proc.returncode != 0 and "--valid-percent" in proc.stdout


def test_the_installed_package_source_names_its_versions(tmp_path):
    # the default source: installed distributions; pytest's own files stand in for torch and fairseq here
    proc = subprocess.run(
        [sys.executable, str(BUILD), "--packages", "pytest", "--out", str(tmp_path / "out"), "--min-files", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    manifest = json.loads((tmp_path / "out" / "corpus.json").read_text())
    import pytest as installed

    assert manifest["source"] == {"packages": {"pytest": installed.__version__}}
    proc = subprocess.run(
        [sys.executable, str(BUILD), "--packages", "no-such-package", "--out", str(tmp_path / "x")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.returncode != 0 and "--packages no-such-package" in proc.stdout


@pytest.mark.e2e
def test_prepare_binarises_a_folder_for_fairseq(tmp_path):
    sources = make_sources(tmp_path / "src", files=60)
    env = subprocess_env()
    proc = subprocess.run(["bash", str(PREPARE), "--data", str(sources), "--out", str(tmp_path / "work")], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    data_bin = tmp_path / "work" / "data-bin"
    for split in ("train", "valid", "test"):
        assert (data_bin / f"{split}.bin").stat().st_size > 0
    symbols = [line.split()[0] for line in (data_bin / "dict.txt").read_text().splitlines()]
    assert "<v0>" in symbols and "numpy" in symbols and "<nl>" in symbols
    assert json.loads((data_bin / "corpus.json").read_text())["source"]["data"] == str(sources)
    proc = subprocess.run(["bash", str(PREPARE), "--bogus"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)  # fmt: skip
    assert proc.returncode == 2 and "--data DIR" in proc.stdout


@pytest.mark.e2e
def test_compare_trains_scores_and_reports_every_run_once(tmp_path):
    # examples/code/compare.sh at a tiny scale on a tiny corpus: every kind it names is trained, scored on the whole
    # test split, cluster-paper also token by token; a second call finds everything done and trains nothing
    sources = make_sources(tmp_path / "src", files=400)  # a valid and a test split of several samples
    env = subprocess_env(WINDOW="8", TOKENS="64", BATCH="8", CLUSTERS="4", UPDATES="2", CAUSAL_BLOCKS="1")
    work = tmp_path / "work"
    proc = subprocess.run(["bash", str(PREPARE), "--data", str(sources), "--out", str(work)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    runs = ["full-s1", "none-s1", "cluster-strict-next-s1", "cluster-paper-s1"]
    compare = ["bash", str(REPO / "examples" / "code" / "compare.sh"), "--work", str(work)]
    proc = subprocess.run([*compare, *runs], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1200)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    test_tokens = None
    for run in runs:
        result = json.loads((work / "results" / "code" / f"{run}.json").read_text())
        assert result["reach"] == 4 * 7  # full attention scored in the windowed models' buckets
        test_tokens = test_tokens or result["total"]["tokens"]
        assert result["total"]["tokens"] == test_tokens  # the whole split, the same tokens for every kind
        checkpoint = torch.load(work / "ckpt" / run / "checkpoint_last.pt", map_location="cpu", weights_only=False)
        assert checkpoint["optimizer_history"][-1]["num_updates"] == 2
    assert checkpoint["cfg"]["model"]["cluster_causality"] == "paper"
    values = torch.load(work / "ckpt" / "cluster-strict-next-s1" / "checkpoint_last.pt", weights_only=False)
    assert values["cfg"]["model"]["long_range_values"] == "next"
    causal = json.loads((work / "causal" / "cluster-paper-s1.json").read_text())
    assert 0 < causal["plain"]["tokens"] == causal["causal"]["tokens"] <= 64  # one block (CAUSAL_BLOCKS=1)
    table = (work / "report" / "results.md").read_text()
    for kind in ("full", "none", "cluster-strict-next", "cluster-paper"):
        assert f"| {kind} |" in table
    assert (work / "report" / "loss_by_distance.png").is_file()
    again = subprocess.run([*compare, *runs], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0 and "training" not in again.stdout and "scoring" not in again.stdout, again.stdout
    bad = subprocess.run([*compare, "dense-s1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert bad.returncode == 2 and "RUN must be KIND-sSEED" in bad.stdout
    empty = subprocess.run([*compare[:-1], str(tmp_path), "none-s1"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert empty.returncode == 2 and "run examples/code/prepare.sh --out" in empty.stdout
