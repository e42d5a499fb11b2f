"""A script removes only what it made itself, run for real: examples/code/prepare.sh --out, examples/demo.sh WORK,
examples/qa/cpu_pretrained.sh --out (run, --dry-run, --prepare-only), benchmarks/qa_device/prepare.sh --out / --work
and benchmarks/gpu_check/bundle.sh DEST refuse (exit 2, naming the folder and its flag) a non-empty folder they did
not make, and change nothing in it; a folder one of them made before (its marker file, examples/recipe_args.sh) takes
a re-run. bundle.sh finds its Python 3.12 or asks for it by name,
and a failing build leaves the earlier bundle as it was."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, subprocess_env
from tests.recipe_runs import recipe, snapshot
from tests.test_code_corpus import make_sources

MARKER = ".made-by-recipe"
BUNDLE = REPO / "benchmarks" / "gpu_check" / "bundle.sh"


def foreign_folder(path: Path) -> Path:
    """A user's folder holding what each script would otherwise replace or remove."""
    for name in ("data-bin/dict.txt", "checkpoints/checkpoint_best.pt", "encoder/model.pt", "notes.txt", "a.whl"):
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(f"the user's {name}\n")
    return path


def refused(command: list, cwd: Path, watched: Path, **env) -> str:
    before = snapshot(watched)
    full_env = subprocess_env(OMP_NUM_THREADS="1", **env)
    proc = subprocess.run(list(map(str, command)), cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert snapshot(watched) == before, proc.stdout[-3000:]
    return proc.stdout


def names_the_folder(out: str, shown: str, script: str) -> bool:
    return f"{shown}: that folder holds files {script} did not make (it has no {MARKER})" in out


def test_code_prepare_refuses_an_out_it_did_not_make(tmp_path):
    sources, out = make_sources(tmp_path / "src", files=60), foreign_folder(tmp_path / "out")
    text = refused(["bash", REPO / "examples/code/prepare.sh", "--data", sources, "--out", out], tmp_path, tmp_path)
    assert names_the_folder(text, f"--out {out}", "examples/code/prepare.sh") and "give a new or empty --out" in text


def test_code_prepare_makes_its_own_out_again_and_names_what_it_skipped(tmp_path):
    sources = make_sources(tmp_path / "src", files=60)
    (sources / "gone.py").symlink_to(tmp_path / "nowhere.py")
    (sources / "package.py").mkdir()
    for _ in range(2):  # the second run redoes the folder the first one made
        code, text = recipe("code/prepare.sh", "--data", sources, "--out", "work", cwd=tmp_path)
        assert code == 0 and (tmp_path / "work/data-bin/dict.txt").is_file(), text[-3000:]
    assert (tmp_path / "work" / MARKER).read_text().strip() == "examples/code/prepare.sh"
    assert f"skipped {sources / 'gone.py'}: a broken symbolic link" in text
    assert f"skipped {sources / 'package.py'}: a folder, not a file" in text


@pytest.mark.parametrize("made_by", [None, "examples/code/prepare.sh"])
def test_demo_refuses_a_work_folder_it_did_not_make(tmp_path, made_by):
    work = foreign_folder(tmp_path / "work")
    if made_by:
        (work / MARKER).write_text(made_by + "\n")
    text = refused(["bash", REPO / "examples/demo.sh"], tmp_path, tmp_path, WORK=str(work), UPDATES="1")
    shown = f"WORK={work}"
    if made_by:
        assert f"{shown}: that folder was made by {made_by}, not by examples/demo.sh; give another WORK" in text
    else:
        assert names_the_folder(text, shown, "examples/demo.sh")


@pytest.mark.parametrize("mode", [(), ("--dry-run",), ("--prepare-only",)])
def test_qa_cpu_recipe_refuses_an_out_it_did_not_make(tmp_path, mode):
    out = foreign_folder(tmp_path / "out")
    command = ["bash", REPO / "examples/qa/cpu_pretrained.sh", "--data", REPO / "examples/data/squad", "--out", out]
    text = refused(command + list(mode), tmp_path, tmp_path, PRECISION="fp32")
    assert names_the_folder(text, f"--out {out}", "examples/qa/cpu_pretrained.sh")
    assert "give a new or empty --out" in text


@pytest.mark.parametrize("flag", ["--out", "--work"])
def test_qa_device_prepare_refuses_a_folder_it_did_not_make(tmp_path, flag):
    folders = {"--out": tmp_path / "out", "--work": tmp_path / "work"}
    foreign_folder(folders[flag])
    command = ["bash", REPO / "benchmarks/qa_device/prepare.sh", "--no-bundle", "--data", tmp_path / "squad"]
    text = refused(command + [x for f, d in folders.items() for x in (f, d)], tmp_path, tmp_path)
    assert names_the_folder(text, f"{flag} {folders[flag]}", "benchmarks/qa_device/prepare.sh")
    # the repository root: the working tree is not a payload folder
    before = snapshot(REPO / "examples")
    text = refused(command + ["--out", ".", "--work", tmp_path / "new"], REPO, tmp_path)
    assert names_the_folder(text, f"--out {REPO}", "benchmarks/qa_device/prepare.sh")
    assert snapshot(REPO / "examples") == before


def fake_python(folder: Path, build_fails: bool) -> Path:
    """An interpreter that says it is Python 3.12 and answers bundle.sh's pip and wheel calls with empty wheels of the
    right names (or fails the fairseq build): bundle.sh's own steps run for real, without PyPI."""
    script = folder / "bin" / "python"
    script.parent.mkdir(parents=True)
    fail = "exit 1" if build_fails else ":"
    script.write_text(f"""#!/usr/bin/env bash
case "$*" in
  *"import torch"*) exit 1 ;;
  *"-m pip wheel"*fairseq-fixed*) {fail}
    for a; do [[ "$prev" == -w ]] && touch "$a/fairseq_fixed-0.12.3.1-cp312-cp312-linux_x86_64.whl"; prev=$a; done ;;
  *"-m pip wheel"*antlr4*) for a; do [[ "$prev" == -w ]] && touch "$a/antlr4_python3_runtime-4.9.3-py3-none-any.whl"
    prev=$a; done ;;
  *"-m pip wheel"*) for a; do [[ "$prev" == -w ]] && touch "$a/fairseq_clusterformer-0-py3-none-any.whl"; prev=$a
    done ;;
  *"-m pip download"*) for a; do [[ "$prev" == -d ]] && d=$a; prev=$a; done
    for n in hydra_core omegaconf bitarray numpy; do touch "$d/$n-1-py3-none-any.whl"; done ;;
  *"-m wheel unpack"*) mkdir -p "$5/fairseq_fixed-0.12.3.1/fairseq/examples" ;;
  *"-m wheel pack"*) touch "$5/fairseq_fixed-0.12.3.1-cp312-cp312-linux_x86_64.whl" ;;
esac
exit 0
""")
    script.chmod(0o755)
    (script.parent / "python3.12").symlink_to("python")
    return script


def bundle(dest: Path, python: Path, **env) -> subprocess.CompletedProcess:
    env = dict(os.environ, PY312=str(python), BUILD_VENV=str(python.parent.parent), **env)
    return subprocess.run(["bash", BUNDLE, dest], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_bundle_refuses_a_dest_it_did_not_make_and_keeps_its_own_bundle_when_a_build_fails(tmp_path):
    dest = foreign_folder(tmp_path / "dest")
    text = refused(["bash", BUNDLE, dest], REPO, tmp_path, PY312=str(fake_python(tmp_path / "ok", False)))
    assert names_the_folder(text, f"DEST={dest}", "benchmarks/gpu_check/bundle.sh")
    assert "DEST: expected a folder, got an empty value" in refused(["bash", BUNDLE, ""], REPO, tmp_path)

    mine = tmp_path / "mine"
    proc = bundle(mine, tmp_path / "ok/bin/python")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = snapshot(mine)
    assert "fairseq_fixed-0.12.3.1-cp312-cp312-linux_x86_64.whl" in first and "numpy1/numpy-1-py3-none-any.whl" in first
    (mine / "README.txt").write_text("what the user put beside the wheels\n")
    before = snapshot(mine)
    proc = bundle(mine, fake_python(tmp_path / "failing", True))
    assert proc.returncode != 0
    assert snapshot(mine) == before  # the failing build left the earlier bundle whole
    proc = bundle(mine, tmp_path / "ok/bin/python", WITH_NUMPY1="0")  # a re-run into its own folder
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "numpy1" not in snapshot(mine) and (mine / "README.txt").is_file()


@pytest.mark.skipif(shutil.which("python3.12", path="/usr/bin:/bin") is not None, reason="the system has Python 3.12")
def test_bundle_finds_python_3_12_or_asks_for_it_by_name(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "pyenv")}
    # a stand-in build venv that fails its build: no PyPI is asked whatever bundle.sh does
    failing = {"BUILD_VENV": str(fake_python(tmp_path / "failing", True).parent.parent)}
    proc = subprocess.run(["bash", BUNDLE, tmp_path / "dest"], env={**env, **failing}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "name one with PY312=/path/to/python3.12" in proc.stderr, proc.stderr
    assert not (tmp_path / "dest").exists()
    # a pyenv install of 3.12 is found without naming it (a stand-in interpreter under PYENV_ROOT builds the bundle)
    found = fake_python(tmp_path / "pyenv/versions/3.12.7", False)
    proc = subprocess.run(["bash", BUNDLE, tmp_path / "dest"], env={**env, "BUILD_VENV": str(found.parent.parent)},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "dest/omegaconf-1-py3-none-any.whl").is_file()


def test_bundle_names_only_scripts_that_exist():
    header = BUNDLE.read_text().split("\nset -euo pipefail")[0]
    named = set(re.findall(r"(?:examples|benchmarks)/[\w/]+\.sh", header))
    assert named and all((REPO / name).is_file() for name in named), named
    assert "/root/" not in BUNDLE.read_text()
