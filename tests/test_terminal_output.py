"""What the terminal shows a user: during the QA recipe's fine-tuning (examples/qa/train_progress.py) the updates done
with the time left, the warnings and errors as they are, every line of fairseq's output kept in the run's log; and no
line a user cannot act on (fairseq's "Please install tensorboardX" in the package's own scripts, hydra's deprecation
warnings, faiss's loader lines)."""

import subprocess
import sys

from tests.conftest import REPO, TINY_LM_TRAIN, run_ok, subprocess_env

SCRIPT = REPO / "examples" / "qa" / "train_progress.py"
OUTPUT = """\
INFO:fairseq.tasks.text_to_speech:Please install tensorboardX: pip install tensorboardX
2026-12-07 01:23:40 | INFO | fairseq_cli.train | model clusterformer_qa, criterion ClusterFormerQACriterion
2026-12-07 01:23:45 | INFO | train_inner | epoch 001: 20 / 1096 loss=19.241, num_updates=20, wall=171
2026-12-07 01:23:50 | WARNING | fairseq_clusterformer.refresh.refresher | K-Means refresh skipped in layer 5
2026-12-07 01:36:28 | INFO | train_inner | epoch 001: 40 / 1096 loss=18.906, num_updates=40, wall=934
2026-12-07 01:40:00 | INFO | train | epoch 001 | loss 18.5 | num_updates 50 | wall 1100
Traceback (most recent call last):
  File "fairseq_cli/train.py", line 1, in <module>
ValueError: a cause named here
"""


def test_the_log_keeps_everything_and_the_terminal_shows_progress_and_trouble(tmp_path):
    log = tmp_path / "run.train.log"
    log.write_text("an earlier call's part\n")
    proc = subprocess.run([sys.executable, SCRIPT, log, "700"], input=OUTPUT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert log.read_text() == "an earlier call's part\n" + OUTPUT  # appended, whole
    shown = proc.stdout.splitlines()
    assert shown[0].startswith("| update 20 of 700 (2 %), loss 19.241, 0 min so far") and "left" not in shown[0]
    assert "K-Means refresh skipped in layer 5" in shown[1]
    assert shown[2].startswith("| update 40 of 700 (5 %), loss 18.906,") and shown[2].endswith("min left")
    assert shown[3].startswith("| update 50 of 700 (7 %), loss 18.5,")
    assert shown[4:] == OUTPUT.splitlines()[-3:]  # the traceback whole
    assert "tensorboardX" not in proc.stdout and "criterion ClusterFormerQACriterion" not in proc.stdout


def test_the_packages_console_scripts_do_not_ask_for_tensorboardx():
    proc = subprocess.run([sys.executable, "-m", "fairseq_clusterformer.qa.scripts.ask", "--help"], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "--jsonl" in proc.stdout
    assert "tensorboardX" not in proc.stderr, proc.stderr


def test_fairseq_train_shows_no_hydra_warnings_and_faiss_no_loader_lines(lm_data, tmp_path):
    out = run_ok("fairseq-train", lm_data, *TINY_LM_TRAIN, "--max-update", "1", "--no-save", "--save-dir", tmp_path)
    assert "hydra" not in out and "ConfigStore" not in out, out[:3000]
    proc = subprocess.run([sys.executable, "-c", "import fairseq_clusterformer, faiss"], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "faiss.loader" not in proc.stderr, proc.stderr
