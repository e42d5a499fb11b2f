"""Checkpoints written by an earlier version of the plug-in (before the package was restructured, see
tests/data/old_checkpoints/README.md) evaluate, predict and resume exactly as that version did."""

import json
import re
import shutil

import pytest
import torch

from tests.conftest import PACKAGE, REPO, run_cli, run_ok
from tests.test_end_to_end import perplexity
from tests.test_resume import HANDS_TASK_STATE_BACK

pytestmark = pytest.mark.e2e

OLD = REPO / "tests" / "data" / "old_checkpoints"
EXPECTED = json.loads((OLD / "expected.json").read_text())
# the figures are exact under the torch that wrote them; another torch (the fairseq 0.12.2 environment's 2.0) rounds
# its kernels otherwise, so there they must agree to the printed precision's last digits only
SAME_TORCH = torch.__version__.split("+")[0] == EXPECTED["torch"]


def agrees(ours: float, theirs: float, slack: float) -> bool:
    return ours == theirs if SAME_TORCH else abs(ours - theirs) <= slack


# the old run's settings (README.md), which a resume must repeat
LM_TRAIN = [
    "--user-dir", PACKAGE, "--task", "clusterformer_lm", "--arch", "clusterformer_lm_tiny", "--tokens-per-sample",
    "200", "--sample-break-mode", "none", "--optimizer", "adam", "--lr", "0.003", "--batch-size", "4",
    "--num-workers", "0", "--cluster-update-interval", "5", "--kmeans-swap-delay", "0", "--kmeans-backend", "torch",
    "--memory-size", "2000", "--num-clusters", "8", "--no-save-optimizer-state", "--no-epoch-checkpoints", "--seed",
    "3", "--cpu", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
]  # fmt: skip


def test_an_old_language_model_evaluates_as_before():
    out = run_ok(
        "fairseq-eval-lm", OLD / "lm" / "bin", "--path", OLD / "lm" / "checkpoint_last.pt", "--user-dir", PACKAGE,
        "--tokens-per-sample", "200", "--batch-size", "4", "--cpu", "--gen-subset", "test",
    )  # fmt: skip
    loss, ppl = perplexity(out)
    assert agrees(loss, EXPECTED["lm"]["eval_lm_test_loss_base2"], 0.002), out[-2000:]
    assert agrees(ppl, EXPECTED["lm"]["eval_lm_test_ppl"], 0.05), out[-2000:]


def test_an_old_language_model_resumes_as_before(tmp_path):
    save = tmp_path / "save"
    save.mkdir()
    shutil.copyfile(OLD / "lm" / "checkpoint_last.pt", save / "checkpoint_last.pt")
    out = run_ok(
        "fairseq-train", OLD / "lm" / "bin", *LM_TRAIN, "--valid-subset", "test", "--max-update", "16",
        "--save-dir", save, "--reset-optimizer", "--log-format", "simple", "--log-interval", "1",
    )  # fmt: skip
    steps = []
    for line in out.splitlines():
        if "train_inner" in line:
            fields = dict(re.findall(r"(\w+)=([0-9.]+)", line))
            steps.append(
                {
                    "num_updates": int(fields["num_updates"]),
                    "loss": float(fields["loss"]),
                    "kmeans_refreshes": int(fields["kmeans_refreshes"]),
                }
            )
    expected = EXPECTED["lm"]["resume_train_inner"]
    if not HANDS_TASK_STATE_BACK:
        # fairseq 0.12.2 never hands the banks and the K-Means schedule back to a resumed run (the same holds for a
        # checkpoint of today): the weights load and train on, the refreshes start again
        assert [s["num_updates"] for s in steps] == [s["num_updates"] for s in expected], out[-3000:]
        assert all(0 < s["loss"] < 20 for s in steps) and "valid on 'test' subset" in out
        return
    assert [(s["num_updates"], s["kmeans_refreshes"]) for s in steps] == [
        (s["num_updates"], s["kmeans_refreshes"]) for s in expected
    ]
    assert all(agrees(ours["loss"], theirs["loss"], 0.05) for ours, theirs in zip(steps, expected)), steps
    valid = re.search(r"valid on 'test' subset \| loss ([0-9.]+)", out)
    assert valid and agrees(float(valid.group(1)), EXPECTED["lm"]["resume_valid_loss"], 0.05)
    # the save of this run: the banks in checkpoint_last.pt only
    banks = {}
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        state = torch.load(save / name, map_location="cpu", weights_only=False)
        banks[name] = state["extra_state"]["ClusterFormerLMTask"]["centroid_refresh"]["banks"]
    assert banks["checkpoint_best.pt"] is None and len(banks["checkpoint_last.pt"]) == 2


def test_an_old_qa_model_predicts_as_before(tmp_path):
    pred = tmp_path / "valid.pred.json"
    out = run_ok(
        "fairseq-clusterformer-qa-predict", OLD / "qa" / "bin", "--path", OLD / "qa" / "checkpoint.pt", "--split",
        "valid", "--output", pred, "--cpu",
    )  # fmt: skip
    answers, before = json.loads(pred.read_text()), json.loads((OLD / "qa" / "valid.pred.json").read_text())
    assert answers == before if SAME_TORCH else set(answers) == set(before)
    scores = re.search(r'\{"exact_match": [^}]*\}', out)
    assert scores, out[-2000:]
    scores = json.loads(scores.group(0))
    assert agrees(scores["exact_match"], EXPECTED["qa"]["em"], 7.0) and agrees(scores["f1"], EXPECTED["qa"]["f1"], 7.0)


def test_a_qa_data_folder_moved_with_its_tokeniser_model_inside_predicts(tmp_path):
    """qa_config.json records the sentencepiece model's absolute path on the machine that binarised the data; in a
    moved folder the model is looked for in the folder itself (and in ``spm/`` beside it, as the fixture has it)."""
    data = tmp_path / "moved"
    shutil.copytree(OLD / "qa" / "bin", data)
    shutil.copyfile(OLD / "qa" / "spm" / "qa.model", data / "qa.model")
    pred = tmp_path / "valid.pred.json"
    run_ok(
        "fairseq-clusterformer-qa-predict", data, "--path", OLD / "qa" / "checkpoint.pt", "--split", "valid",
        "--output", pred, "--cpu",
    )  # fmt: skip
    assert set(json.loads(pred.read_text())) == set(json.loads((OLD / "qa" / "valid.pred.json").read_text()))


def test_a_qa_data_folder_moved_without_its_tokeniser_model_names_what_was_tried(tmp_path):
    data = tmp_path / "moved"
    shutil.copytree(OLD / "qa" / "bin", data)
    pred = tmp_path / "valid.pred.json"
    code, out = run_cli(
        "fairseq-clusterformer-qa-predict", data, "--path", OLD / "qa" / "checkpoint.pt", "--split", "valid",
        "--output", pred, "--cpu",
    )  # fmt: skip
    assert code != 0
    recorded = json.loads((data / "qa_config.json").read_text())["sentencepiece_model"]
    last = out.strip().splitlines()[-1]
    for named in (str(data / "qa_config.json"), recorded, str(data / "qa.model"), str(tmp_path / "spm" / "qa.model")):
        assert named in last, last
    assert not pred.exists()
