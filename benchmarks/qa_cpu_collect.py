"""Collect one finished run of examples/qa/cpu_pretrained.sh into a results folder that
``python -m benchmarks.qa_report.table`` reads (the layout of benchmarks/qa_device's results), so that CPU
runs, committed one at a time over several sessions, give table b's rows and paired intervals.

    python -m benchmarks.qa_cpu_collect data-bin/qa/reduced/article_cluster-hybrid-bf16-attdrop0_seed1 \
        --results benchmarks/results/qa_pretrained/cpu_reduced [--reach reach.json] [--ablation cluster_ablation.json] \
        [--train-seconds 2130]

It reads what the recipe left: RUN/summary.json (EM / F1 and the span baselines), RUN/valid.pred.json, RUN/eval.log, and
RUN.train.log beside RUN (the `+ fairseq-train ...` command line that train.sh echoes, and fairseq's progress lines).
The settings are parsed from that command, not restated by hand: what ran is what is recorded. It writes
RESULTS/CONTEXTS_VARIANT_seedSEED/ (VARIANT: the kind, -hybrid, -layerN as benchmarks/qa_device names them; the
precision and attention dropout, the same for every row of one results folder, are settings, not part of the name):
summary.json (settings, EM / F1, the CPU's model name and its matmul rates, the threads and seconds: the scoring's from
qa-predict's own '| scoring:' line where eval.log has it), valid.pred.json, eval.log, command.txt ($RUNS and $REPO for
this machine's folders), train_inner.log (the progress lines and the K-Means refreshes'), and reach.json and
cluster_ablation.json (benchmarks/qa_cluster_ablation.py) when given. An existing run folder there is refused: results
are not overwritten.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks.machine import cpu_model, matmul_record
from benchmarks.qa_device.runs import VARIANTS  # the row names of table b

# fairseq-train flag -> (settings key, type)
FLAGS = {
    "--long-range-layer": ("kind", str),
    "--long-range-mode": ("long_range_mode", str),
    "--long-range-layers": ("long_range_layers", str),
    "--seed": ("seed", int),
    "--max-update": ("updates", int),
    "--lr": ("lr", float),
    "--warmup-updates": ("warmup", int),
    "--batch-size": ("batch", int),
    "--max-question-tokens": ("max_question", int),
    "--max-context-train": ("max_context_train", int),
    "--max-context-eval": ("max_context_eval", int),
    "--num-clusters": ("clusters", int),
    "--cluster-update-interval": ("kmeans_interval", int),
    "--memory-size": ("memory", int),
    "--window-size": ("window", int),
    "--window-stride": ("stride", int),
    "--dropout": ("dropout", float),
    "--attention-dropout": ("attention_dropout", float),
}


def fail(why: str) -> None:
    print(f"qa_cpu_collect.py: {why}", file=sys.stderr)
    sys.exit(2)


def command_settings(command: str) -> dict[str, Any]:
    """The settings of a `+ fairseq-train ...` line; the last occurrence of a flag wins, as in fairseq."""
    words = shlex.split(command.lstrip("+ "))
    settings: dict[str, Any] = {}
    for i, word in enumerate(words[:-1]):
        if word in FLAGS:
            key, cast = FLAGS[word]
            settings[key] = cast(words[i + 1])
    settings["precision"] = "autocast-bf16" if "--autocast-bf16" in words else "fp32"
    missing = sorted({key for key, _ in FLAGS.values()} - set(settings))
    if missing:
        fail(f"the fairseq-train command lacks the settings {missing}: {command[:200]}")
    return settings


def variant(settings: dict[str, Any]) -> str:
    """The row name benchmarks/qa_device gives the same kind, mode and layers, so that CPU and GPU rows read alike;
    a combination it does not know is no row of table b."""
    ran = (settings["kind"], settings["long_range_mode"], settings["long_range_layers"])
    names = [name for name, spec in VARIANTS.items() if spec == ran or (ran[0] == "none" and spec[0] == "none")]
    if not names:
        fail(f"--long-range-layer {ran[0]} --long-range-mode {ran[1]} --long-range-layers {ran[2]}: no variant of "
             f"benchmarks/qa_device/runs.py's VARIANTS ({', '.join(VARIANTS)})")  # fmt: skip
    return names[0]


def scoring_seconds(run: Path, given_wall: float | None, given_cpu: float | None) -> tuple[float | None, float | None]:
    """The scoring's wall and CPU seconds: each as given, else from qa-predict's own '| scoring:' line in eval.log,
    else (an eval.log of before that line, CPU unknown) the wall as the time from the last checkpoint's write to the
    predictions' write, which holds only where the scoring followed the training without a stop."""
    found = re.search(r"^\| scoring: (\d+) s wall, (\d+) s CPU$", (run / "eval.log").read_text(), re.MULTILINE)
    wall, cpu = (float(found[1]), float(found[2])) if found else (None, None)
    checkpoint = run / "checkpoint_last.pt"
    if wall is None and checkpoint.is_file():
        wall = (run / "valid.pred.json").stat().st_mtime - checkpoint.stat().st_mtime
    return (wall if given_wall is None else given_wall), (cpu if given_cpu is None else given_cpu)


def portable(command: str, runs: Path) -> str:
    """The fairseq-train line with this machine's folders as $RUNS (the recipe's --out) and $REPO (the checkout the
    plug-in came from): a committed record names no home folder, and runs again where both are set."""
    command = re.sub(r"--user-dir \S+/fairseq_clusterformer\b", "--user-dir $REPO/fairseq_clusterformer", command)
    return command.replace(f"{runs}/", "$RUNS/")


def collect(
    run: Path,
    results: Path,
    reach: Path | None,
    train_seconds: float | None,
    predict_cpu: float | None = None,
    predict_wall: float | None = None,
    ablation: Path | None = None,
    threads: int | None = None,
) -> Path:
    train_log = run.parent / f"{run.name}.train.log"
    for path in (run / "summary.json", run / "valid.pred.json", run / "eval.log", train_log):
        if not path.is_file():
            fail(f"{path} not found: is {run} a finished run of examples/qa/cpu_pretrained.sh?")
    lines = train_log.read_text(encoding="utf-8", errors="replace").splitlines()
    commands = [line for line in lines if line.startswith("+ fairseq-train ")]
    if not commands:
        fail(f"{train_log} holds no '+ fairseq-train' line")
    settings = command_settings(commands[-1])  # a resumed run's last call
    settings["variant"] = variant(settings)
    contexts = run.name.split("_")[0]
    name = f"{contexts}_{settings['variant']}_seed{settings['seed']}"
    recipe_summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    if run.name not in recipe_summary:
        fail(f"{run / 'summary.json'} has no scores for {run.name}")
    scores = recipe_summary[run.name]
    # fairseq's progress lines and the refreshes' own (how far each moved the centroids: does the run need more)
    kept = ("| train_inner |", "| INFO | train |", "| fairseq_clusterformer.refresh.refresher |")
    progress = [line for line in lines if any(key in line for key in kept)]
    out = results / name
    if out.exists():
        fail(f"{out} exists: results are not overwritten (remove it to collect {run} again)")
    out.mkdir(parents=True)
    predict_wall, predict_cpu = scoring_seconds(run, predict_wall, predict_cpu)
    summary = {
        "run": name,
        "recipe_run": run.name,
        "settings": settings,
        **{key: scores[key] for key in ("exact_match", "f1", "answered", "questions")},
        "baselines": {key: value for key, value in recipe_summary.items() if key != run.name},
        "device": f"{cpu_model()}, CPU",
        "matmul_gflops_one_thread": matmul_record(),
        "seconds": {
            "threads": threads,
            "train_wall": train_seconds,
            "predict_wall": None if predict_wall is None else round(predict_wall),
            "predict_cpu": predict_cpu,
        },
        "reach": reach is not None,
        **({"cluster_ablation": True} if ablation is not None else {}),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    shutil.copyfile(run / "valid.pred.json", out / "valid.pred.json")
    shutil.copyfile(run / "eval.log", out / "eval.log")
    (out / "command.txt").write_text(portable(commands[-1], run.parent) + "\n", encoding="utf-8")
    (out / "train_inner.log").write_text("\n".join(progress) + "\n", encoding="utf-8")
    if reach is not None:
        shutil.copyfile(reach, out / "reach.json")
    if ablation is not None:
        shutil.copyfile(ablation, out / "cluster_ablation.json")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the recipe's run folder, OUT/CONTEXTS_..._seedSEED")
    parser.add_argument("--results", type=Path, required=True, help="where the run's folder goes")
    parser.add_argument("--reach", type=Path, help="fairseq-clusterformer-qa-reach --json of this run's checkpoint")
    parser.add_argument("--ablation", type=Path, help="benchmarks/qa_cluster_ablation.py --json of this checkpoint")
    parser.add_argument("--train-seconds", type=float, help="the recipe's '| fine-tuning RUN: N s'")
    parser.add_argument("--threads", type=int, help="the threads the run trained and scored with (THREADS)")
    parser.add_argument("--predict-cpu-seconds", type=float, help="the scoring process's CPU seconds, where measured")
    parser.add_argument(
        "--predict-wall-seconds",
        type=float,
        help="the scoring's wall seconds, where its eval.log lacks qa-predict's '| scoring:' line and it did not "
        "follow the training at once (a stopped scoring run again)",
    )
    args = parser.parse_args(argv)
    for flag, path in (("--reach", args.reach), ("--ablation", args.ablation)):
        if path is not None and not path.is_file():
            fail(f"{flag} {path} not found")
    seconds = (args.train_seconds, args.predict_cpu_seconds, args.predict_wall_seconds)
    print(collect(args.run, args.results, args.reach, *seconds, ablation=args.ablation, threads=args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
