"""One QA series of table b, from its settings file to its table: the runs it lacks trained (or resumed), each
finished run scored, analysed and collected into the series' folder, then the paired table printed.

    python -m benchmarks.qa_series benchmarks/results/qa_pretrained/cpu_budget --runs ~/qa_scale/runs
    python -m benchmarks.qa_series SERIES --runs DIR --dry-run      # what it would do, nothing run
    python -m benchmarks.qa_series SERIES --runs DIR --seeds 2 --variants none cluster-layer6   # one pair only
    python -m benchmarks.qa_series SERIES --runs DIR --seeds 2 --variants none --threads 2      # one run, both cores

A PRECISION=bf16 series runs on any CPU: where the CPU has no native bfloat16 (no AVX512-BF16 or AMX) the recipe's
--autocast-bf16 runs its products through float32 kernels at bfloat16's rounding points (--bf16-products auto), and
each collected run's summary says which of the two its CPU did (``matmul_gflops_one_thread``).

SERIES/series.json is the series' one settings file:

    {"contexts": "article",                    # examples/qa/cpu_pretrained.sh --contexts
     "settings": {"UPDATES": 1400, ...},       # the recipe's environment, the same for every run of the series
     "variants": {"none": {"KIND": "none"}, "cluster-layer6": {"KIND": "cluster", "LONG_RANGE_LAYERS": 6}},
     "seeds": [1, 2],
     "parallel": 2,                            # runs side by side (a pair: one thread each)
     "reach": ["cluster-layer6"],              # fairseq-clusterformer-qa-reach on these variants' checkpoints
     "ablation": ["cluster-layer6"],           # python -m benchmarks.qa_cluster_ablation on these
     "analysis_questions": 300,                # the held-out questions reach and the ablation read
     "table": {"squad": "examples/data/squad/dev-v1.1.json", "held_out_from": 40, "baseline_from": null}}

A series that differs from another in a few settings names it as its base and says only what differs:

    {"base": "../cpu_budget", "settings": {"UPDATES": 800}, "variants": ["none", "cluster-layer6"]}

('settings' and 'table' are merged over the base's key by key; 'variants' as a list keeps those of the base's; any
other key replaces the base's.)

A run is done when its folder SERIES/CONTEXTS_VARIANT_seedSEED is committed. Any other run is trained by the recipe
in RUNS (outside the work tree), which resumes it from its checkpoint_last.pt where one is there; a run the recipe's
MAX_HOURS stops gets its progress record in SERIES/progress/ (benchmarks.qa_progress), to be continued by the same
command in a later session; a finished one is scored by the recipe, its progress record is written anew for the
finished checkpoint, then reach and the ablation run on it and benchmarks.qa_cpu_collect copies it into SERIES (its
training seconds: the hours its checkpoint records).
Arguments after `--` go to the recipe (`-- --hf DIR --data DIR`). Run from the checkout whose code is to train (a
clone at a fixed commit, so that edits to the work tree never reach a run in progress); SERIES may lie in another.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "qa" / "cpu_pretrained.sh"
KEYS = {"contexts", "settings", "variants", "seeds", "parallel", "reach", "ablation", "analysis_questions", "table"}
# series key -> (the tool, the JSON it writes in the run folder, qa_cpu_collect.py's flag for it)
ANALYSES = {
    "reach": (["fairseq-clusterformer-qa-reach"], "reach.json", "--reach"),
    "ablation": ([sys.executable, "-m", "benchmarks.qa_cluster_ablation"], "cluster_ablation.json", "--ablation"),
}
STOPPED = 3  # the recipe's exit status for a run MAX_HOURS stopped before its last update


def fail(why: str) -> None:
    print(f"qa_series.py: {why}", file=sys.stderr)
    sys.exit(2)


def load_series(folder: Path, chain: tuple[Path, ...] = ()) -> dict:
    """The series' settings: its series.json over the series its 'base' names (each file resolved the same way)."""
    path = folder.resolve() / "series.json"
    if path in chain:
        fail(f"{path}: the 'base' chain comes back to it ({' -> '.join(map(str, (*chain, path)))})")
    if not path.is_file():
        fail(f"{path} not found: a series folder holds its settings file series.json")
    try:
        own = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        fail(f"{path}: not JSON ({error})")
    unknown = set(own) - KEYS - {"base"}
    if unknown:
        fail(f"{path}: unknown keys {sorted(unknown)} (known: {sorted(KEYS | {'base'})})")
    if "baseline_from" in own.get("table", {}):  # relative to the file that names it, wherever it is inherited
        own["table"]["baseline_from"] = str((path.parent / own["table"]["baseline_from"]).resolve())
    series = own if "base" not in own else over_base(load_series(path.parent / own["base"], (*chain, path)), own, path)
    missing = {"contexts", "settings", "variants", "seeds"} - set(series)
    if missing:
        fail(f"{path}: missing keys {sorted(missing)}, in it and in its base")
    for key in ("reach", "ablation"):
        stray = set(series.get(key, [])) - set(series["variants"])
        if stray:
            fail(f"{path}: '{key}' names {sorted(stray)}, not among the variants {sorted(series['variants'])}")
    return series


def over_base(base: dict, own: dict, path: Path) -> dict:
    """``own`` over ``base``: 'settings' and 'table' merged key by key, 'variants' a list of the base's variant names
    to keep (or a dict of its own), the analyses' lists the base's for the variants kept unless named, the rest
    replaced. A series that differs from another in one setting says only that, so each setting has one home."""
    series = {**base, **{key: value for key, value in own.items() if key != "base"}}
    for key in ("settings", "table"):
        series[key] = {**base.get(key, {}), **own.get(key, {})}
    if isinstance(own.get("variants"), list):
        stray = set(own["variants"]) - set(base["variants"])
        if stray:
            fail(f"{path}: 'variants' names {sorted(stray)}, not among its base's {sorted(base['variants'])}")
        series["variants"] = {name: base["variants"][name] for name in own["variants"]}
    for key in ("reach", "ablation"):
        if key not in own and key in base:
            series[key] = [name for name in base[key] if name in series["variants"]]
    return series


def committed(folder: Path, series: dict, variant: str, seed: int) -> Path:
    """Where qa_cpu_collect.py puts the run (the row name of table b)."""
    return folder / f"{series['contexts']}_{variant}_seed{seed}"


def recipe_env(series: dict, variant: str, seed: int) -> list[str]:
    """The recipe's environment for one run, as KEY=VALUE words: the series' settings, the variant's, the seed."""
    env = {**series["settings"], **series["variants"][variant], "SEED": seed}
    return [f"{key}={value}" for key, value in env.items()]


def recipe_command(series: dict, variant: str, seed: int, runs: Path, extra: list[str]) -> list[str]:
    return ["env", *recipe_env(series, variant, seed), "bash", str(RECIPE), "--contexts", series["contexts"],
            "--out", str(runs), *extra]  # fmt: skip


def run_folder(command: list[str]) -> Path:
    """The folder the recipe trains this run in, as its dry run names it ('| run NAME: PATH')."""
    proc = subprocess.run([*command, "--dry-run"], capture_output=True, text=True, cwd=REPO)
    found = re.search(r"^\| run \S+: (.+)$", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or not found:
        fail(f"the recipe's dry run failed ({shlex.join(command)} --dry-run):\n{proc.stderr.strip()}")
    return Path(found[1])


def scored(run: Path) -> bool:
    """The recipe scored this run: its summary.json holds the run's own row (written after the predictions)."""
    summary = run / "summary.json"
    return summary.is_file() and run.name in json.loads(summary.read_text(encoding="utf-8"))


def logged(command: list[object]) -> None:
    words = list(map(str, command))
    print(f"+ {shlex.join(words)}", flush=True)
    subprocess.run(words, cwd=REPO, check=True)


def python(module: str, *args: object) -> None:
    logged([sys.executable, "-m", f"benchmarks.{module}", *args])


def analyse_and_collect(folder: Path, series: dict, variant: str, run: Path, hours: float) -> None:
    """Reach and the ablation (where the series asks for them) on the finished run, then its folder collected."""
    data = run.parent / f"squad_{series['contexts']}" / "bin"
    checkpoint = run / "checkpoint_last.pt"
    common = ["--path", checkpoint, "--max-examples", series.get("analysis_questions", 300), "--cpu"]
    if series["settings"].get("PRECISION") == "bf16":
        common.append("--autocast-bf16")
    collect: list[object] = []
    for key, (tool, name, flag) in ANALYSES.items():
        if variant not in series.get(key, []):
            continue
        # one written by an earlier call of this command is kept: each is a pure function of the checkpoint
        if not (run / name).is_file():
            logged([*tool, data, *common, "--json", run / name])
        collect += [flag, run / name]
    if "THREADS" in series["settings"]:
        collect += ["--threads", series["settings"]["THREADS"]]
    python("qa_cpu_collect", run, "--results", folder, *collect, "--train-seconds", round(hours * 3600))
    if not committed(folder, series, variant, int(run.name.rsplit("_seed", 1)[1])).is_dir():
        fail(f"series.json's variant '{variant}' is not the row name qa_cpu_collect gave {run.name} in {folder}")


def record_progress(folder: Path, series: dict, run: Path, command: list[str]) -> Path:
    """SERIES/progress/RUN.json (benchmarks.qa_progress): how far the run got, its checkpoint's SHA-256, the CPU."""
    record = folder / "progress" / f"{run.name}.json"
    updates = series["settings"].get("UPDATES", 700)  # the recipe's default
    python("qa_progress", "record", run, "--updates", updates, "--command", shlex.join(command), "--record", record)
    return record


def print_table(folder: Path, series: dict) -> None:
    table = series.get("table", {})
    command = [sys.executable, "-m", "benchmarks.qa_report.table", "--results", str(folder),
               "--squad", table.get("squad", "examples/data/squad/dev-v1.1.json"),
               "--held-out-from", str(table.get("held_out_from", 40))]  # fmt: skip
    if table.get("baseline_from"):
        command += ["--baseline-from", table["baseline_from"]]
    logged(command)


def chosen(flag: str, names: list | None, series_names: list | dict) -> list:
    """The series' seeds or variants that ``flag`` keeps (all where it is not given), in the series' order."""
    stray = [name for name in names or [] if name not in series_names]
    if stray:
        fail(f"{flag} {' '.join(map(str, stray))}: not among the series' {list(series_names)} (series.json)")
    return [name for name in series_names if names is None or name in names]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("series", type=Path, help="the series' results folder, holding series.json")
    parser.add_argument("--runs", type=Path, required=True, help="where the runs train (outside the work tree)")
    parser.add_argument("--dry-run", action="store_true", help="say what is done and what would run; run nothing")
    parser.add_argument("--seeds", type=int, nargs="+", metavar="SEED", help="only these of the series' seeds")
    parser.add_argument("--variants", nargs="+", metavar="NAME",
                        help="only these of its variants (a session with time for one pair runs one: without these "
                             "the next runs start as soon as a pair is collected)")  # fmt: skip
    parser.add_argument("--threads", type=int, metavar="N",
                        help="each run's threads (the recipe's THREADS) instead of the series': a run alone "
                             "on a 2-core machine takes both (they change its time, not its settings)")  # fmt: skip
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    folder, series = args.series.resolve(), load_series(args.series)
    if args.threads is not None:
        if args.threads < 1:
            fail(f"--threads {args.threads}: expected 1 or more")
        series["settings"]["THREADS"] = args.threads
    seeds, variants = (
        chosen("--seeds", args.seeds, series["seeds"]),
        chosen("--variants", args.variants, series["variants"]),
    )
    todo = []
    for seed in seeds:  # seed by seed, so that the runs side by side are pairs of one seed
        for variant in variants:
            done = committed(folder, series, variant, seed)
            if done.is_dir():
                print(f"| {variant} seed {seed}: committed ({done})")
                continue
            command = recipe_command(series, variant, seed, args.runs.resolve(), extra)
            print(f"| {variant} seed {seed}: to run: {shlex.join(command)}")
            todo.append((variant, seed, command))
    if args.dry_run:
        return 0
    width = int(series.get("parallel", 1))
    if todo:  # the encoder's import and the data, once, before runs side by side would both make them in one folder
        logged([*todo[0][2], "--prepare-only"])
    for start in range(0, len(todo), width):
        batch = [(*row, run_folder(row[2])) for row in todo[start : start + width]]  # (variant, seed, command, run)
        # a run scored in an earlier call (its analysis or collection stopped) is not trained or scored again
        procs = [None if scored(run) else subprocess.Popen(command, cwd=REPO) for _, _, command, run in batch]
        for (variant, seed, command, run), proc in zip(batch, procs):
            status = 0 if proc is None else proc.wait()
            if status == STOPPED:
                record = record_progress(folder, series, run, command)
                print(f"| {variant} seed {seed}: stopped by MAX_HOURS; the same command continues it ({record})")
            elif status != 0:
                fail(f"{variant} seed {seed}: the recipe exited with {status}: {shlex.join(command)}")
            else:
                # the finished checkpoint's SHA-256, hours and machine, in place of a stopped run's record; its hours
                # are the training seconds collected (the checkpoint is read once for both)
                record = record_progress(folder, series, run, command)
                hours = json.loads(record.read_text(encoding="utf-8"))["hours_trained"]
                analyse_and_collect(folder, series, variant, run, hours)
    if any(committed(folder, series, v, s).is_dir() for v in series["variants"] for s in series["seeds"]):
        print_table(folder, series)
    return 0


if __name__ == "__main__":
    sys.exit(main())
