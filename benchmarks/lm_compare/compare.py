"""Re-run the paper's Table 3 (language modelling) at a chosen scale: every row through the real fairseq-train and
fairseq-eval-lm, with equal parameters and updates, into one markdown table.

    python -m benchmarks.lm_compare.compare --preset small --work compare-work/small

Rows: sliding window (``--long-range-layer none``), sparse attention, LSH (64 buckets, as the paper sets it) and
Cluster-Former with 64 / 256 / 512 clusters, the long-range rows in strict and in paper causality. Levels: ``word``
(perplexity) and ``char`` (bits per character, one token per byte). ``--seeds 1,2`` trains every row once per seed
(fairseq's ``--seed``: initialisation, data order, dropout, LSH draws, K-Means); the table shows the mean and the
spread (max - min) over the seeds. Each finished run leaves ``result.json`` in its folder (``<level>/<row>`` for
seed 1, ``<level>/<row>-seed<N>`` for the others), so a second run skips it: the driver is resumable, and an
interrupted run restarts from scratch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks.common import stopwatch
from benchmarks.lm_compare.data import DEFAULT_DATA, PACKAGE, prepare_char, prepare_word
from fairseq_clusterformer.scripts.console_scripts import console_script
from fairseq_clusterformer.scripts.lm import presets
from fairseq_clusterformer.scripts.lm.presets import LEVELS, PRESETS, ROWS, Row, Scale


@dataclass
class Result:
    row: str
    level: str
    metric: float  # test perplexity (word) or bits per character (char), from fairseq-eval-lm
    valid_metric: float  # the same on the valid split, from fairseq-train's last validation
    params: int
    train_seconds: float  # fairseq-train's "done training in ..."
    eval_seconds: float  # fairseq-eval-lm's "Evaluated ... in ...s"
    updates: int
    train_command: str
    eval_command: str
    seed: int = 1


def parse_train_log(log: str) -> dict[str, float]:
    """Parameter count, training seconds, updates and last validation loss (base 2) from fairseq-train's log."""
    params = re.search(r"num\. shared model params: ([\d,]+)", log)
    done = re.search(r"done training in ([\d.]+) seconds", log)
    valid = re.findall(r"valid on 'valid' subset \| loss ([\d.]+) .*?num_updates (\d+)", log)
    if not (params and done and valid):
        raise ValueError("fairseq-train log lacks the parameter count, the final validation or 'done training'")
    return {
        "params": int(params.group(1).replace(",", "")),
        "train_seconds": float(done.group(1)),
        "valid_loss": float(valid[-1][0]),
        "updates": int(valid[-1][1]),
    }


def parse_eval_log(log: str) -> dict[str, float]:
    """Loss (base 2), perplexity and seconds from fairseq-eval-lm's output."""
    loss = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", log)
    seconds = re.search(r"Evaluated [\d,]+ tokens in ([\d.]+)s", log)
    if not (loss and seconds):
        raise ValueError("fairseq-eval-lm output lacks 'Loss (base 2): ..., Perplexity: ...'")
    return {"loss": float(loss.group(1)), "ppl": float(loss.group(2)), "eval_seconds": float(seconds.group(1))}


def metric_of(level: str, loss_base2: float) -> float:
    """Perplexity for words, bits per character (the base-2 loss per byte token) for characters."""
    return 2**loss_base2 if level == "word" else loss_base2


def run_logged(command: list[str], log: Path, threads: int) -> str:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    text = log.read_text()
    if code != 0:
        raise RuntimeError(f"{Path(command[0]).name} exited with {code}; log {log}:\n{text[-3000:]}")
    return text


def run_dir(level_dir: Path, row: Row, seed: int) -> Path:
    return level_dir / (row.key if seed == 1 else f"{row.key}-seed{seed}")


def row_commands(row: Row, scale: Scale, data_bin: Path, row_dir: Path, seed: int = 1) -> tuple[list[str], list[str]]:
    save = row_dir / "checkpoints"
    train = [console_script("fairseq-train"), *presets.train_args(row, scale, data_bin, save, PACKAGE, seed)]
    evaluate = [
        console_script("fairseq-eval-lm"),
        *presets.eval_args(scale, data_bin, save / "checkpoint_last.pt", PACKAGE),
    ]
    return train, evaluate


def run_row(row: Row, level: str, scale: Scale, data_bin: Path, row_dir: Path, threads: int, seed: int = 1) -> Result:
    """Train and evaluate one row from scratch; a half-finished row's checkpoints are discarded first."""
    shutil.rmtree(row_dir, ignore_errors=True)
    row_dir.mkdir(parents=True)
    train, evaluate = row_commands(row, scale, data_bin, row_dir, seed)
    trained = parse_train_log(run_logged(train, row_dir / "train.log", threads))
    scored = parse_eval_log(run_logged(evaluate, row_dir / "eval.log", threads))
    result = Result(
        row=row.key,
        level=level,
        metric=metric_of(level, scored["loss"]),
        valid_metric=metric_of(level, trained["valid_loss"]),
        params=int(trained["params"]),
        train_seconds=trained["train_seconds"],
        eval_seconds=scored["eval_seconds"],
        updates=int(trained["updates"]),
        train_command=shlex.join(train),
        eval_command=shlex.join(evaluate),
        seed=seed,
    )
    (row_dir / "result.json").write_text(json.dumps(asdict(result), indent=1))
    shutil.rmtree(row_dir / "checkpoints")  # not needed for the table; at paper scale they would fill the disk
    return result


def load_result(row_dir: Path) -> Result | None:
    done = row_dir / "result.json"
    return Result(**json.loads(done.read_text())) if done.exists() else None


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def markdown_table(preset: str, results: dict[tuple[str, str, int], Result], command: str) -> str:
    lines = [f"Preset `{preset}`; command: `{command}`", ""]
    levels = [level for level in LEVELS if any(done == level for done, _, _ in results)]
    for level in levels:
        name, unit = LEVELS[level]
        lines += [
            f"**{name}** (test {unit}: fairseq-eval-lm on the test split; valid {unit}: fairseq-train's last "
            "validation; train / eval s: the tools' own timings; with several seeds the mean, and the spread "
            "max - min of the test metric)",
            "",
            f"| row | test {unit} | valid {unit} | params | updates | train s | eval s | seeds | test spread |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in ROWS:
            runs = sorted((r for (lv, key, _), r in results.items() if lv == level and key == row.key), key=seed_of)
            if not runs:
                continue
            metrics = [r.metric for r in runs]
            spread = f"{max(metrics) - min(metrics):.3f}" if len(runs) > 1 else "-"
            lines.append(
                f"| {row.label} | {mean(metrics):.3f} | {mean([r.valid_metric for r in runs]):.3f} "
                f"| {runs[0].params:,} | {runs[0].updates} | {mean([r.train_seconds for r in runs]):.0f} "
                f"| {mean([r.eval_seconds for r in runs]):.0f} | {','.join(str(r.seed) for r in runs)} | {spread} |"
            )
        counts = {r.params for (lv, _, _), r in results.items() if lv == level}
        if len(counts) > 1:
            lines.append(f"\nWARNING: parameter counts differ between rows: {sorted(counts)}")
        lines.append("")
    lines += ["Exact commands per row (seed 1; the other seeds differ only in `--seed` and `--save-dir`):", ""]
    for level in levels:
        for row in ROWS:
            first = [r for (lv, key, _), r in results.items() if lv == level and key == row.key]
            if first:
                found = min(first, key=seed_of)
                lines += [f"- {level} / {row.key}:", f"  - `{found.train_command}`", f"  - `{found.eval_command}`"]
    return "\n".join(lines) + "\n"


def seed_of(result: Result) -> int:
    return result.seed


def select_rows(spec: str) -> list[Row]:
    if spec == "all":
        return list(ROWS)
    known = {row.key: row for row in ROWS}
    wanted = [key for key in spec.split(",") if key]
    unknown = [key for key in wanted if key not in known]
    if unknown:
        raise ValueError(f"--rows: unknown row(s) {unknown}; choose from {sorted(known)} or 'all'")
    return [row for row in ROWS if row.key in wanted]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", type=presets.preset_name, choices=sorted(PRESETS), default="small")
    parser.add_argument("--work", type=Path, required=True, help="folder for data, logs and results.md")
    parser.add_argument("--levels", default="word,char", help="comma-separated: word, char")
    parser.add_argument("--rows", default="all", help="comma-separated row keys (see --list-rows) or 'all'")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS for every fairseq process")
    parser.add_argument("--updates", type=int, default=0, help="override the preset's updates (every row alike)")
    parser.add_argument("--seeds", default="1", help="comma-separated fairseq seeds; every row runs once per seed")
    for flag, default in DEFAULT_DATA.items():
        parser.add_argument(flag, type=Path, default=default, help="text file (default: %(default)s)")
    parser.add_argument("--word-data-bin", type=Path, help="already binarised word-level data (e.g. WikiText-103)")
    parser.add_argument("--char-data-bin", type=Path, help="already binarised byte-level data (e.g. enwik8)")
    parser.add_argument("--list-rows", action="store_true", help="print the row keys and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_rows:
        print("\n".join(f"{row.key}: {row.label}" for row in ROWS))
        return 0
    command = shlex.join(["python", "-m", __spec__.name if __spec__ else __name__, *(argv or sys.argv[1:])])
    try:
        rows = select_rows(args.rows)
        levels = [level for level in args.levels.split(",") if level]
        bad = [level for level in levels if level not in LEVELS]
        if bad or not levels:
            raise ValueError(f"--levels: unknown level(s) {bad}; choose from {sorted(LEVELS)}")
        if args.threads < 1 or args.updates < 0:
            raise ValueError("--threads must be positive and --updates non-negative")
        try:
            seeds = sorted({int(seed) for seed in args.seeds.split(",") if seed})
        except ValueError:
            raise ValueError(f"--seeds must be comma-separated integers like 1,2, got {args.seeds!r}") from None
        if not seeds or min(seeds) < 1:
            raise ValueError(f"--seeds must list positive integers, got {args.seeds!r}")
    except ValueError as error:
        print(f"lm_compare: {error}", file=sys.stderr)
        return 2
    results: dict[tuple[str, str, int], Result] = {}
    for level in LEVELS:  # runs finished earlier, also of levels, rows and seeds not selected now, stay in the table
        for row in ROWS:
            for row_dir in [args.work / level / row.key, *(args.work / level).glob(f"{row.key}-seed*")]:
                found = load_result(row_dir)
                if found is not None:
                    results[(level, row.key, found.seed)] = found
    failures = []
    for level in levels:
        scale = PRESETS[args.preset][level]
        scale = replace(scale, updates=args.updates) if args.updates else scale
        level_dir = args.work / level
        try:
            given = args.word_data_bin if level == "word" else args.char_data_bin
            if given is not None:
                data_bin = given
            elif level == "word":
                data_bin = prepare_word(args.word_train, args.word_eval, level_dir)
            else:
                data_bin = prepare_char(args.char_text, level_dir)
        except (OSError, RuntimeError, ValueError) as error:
            print(f"lm_compare: {error}", file=sys.stderr)
            return 2
        for row in rows:
            for seed in seeds:
                row_dir = run_dir(level_dir, row, seed)
                done = results.get((level, row.key, seed))
                train, _ = row_commands(row, scale, data_bin, row_dir, seed)
                if done is not None and done.train_command == shlex.join(train):
                    print(f"[{level}] {row.label}, seed {seed}: done before, skipped")
                    continue
                with stopwatch() as took:
                    print(f"[{level}] {row.label}, seed {seed}: training {scale.updates} updates ...", flush=True)
                    try:
                        found = run_row(row, level, scale, data_bin, row_dir, args.threads, seed)
                    except (RuntimeError, ValueError) as error:
                        failures.append(f"[{level}] {row.label}, seed {seed}: {error}")
                        print(failures[-1], file=sys.stderr)
                        continue
                results[(level, row.key, seed)] = found
                unit = LEVELS[level][1]
                print(
                    f"[{level}] {row.label}, seed {seed}: test {unit} {found.metric:.3f} ({took.wall:.0f}s)", flush=True
                )
                (args.work / "results.md").write_text(markdown_table(args.preset, results, command))
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "results.md").write_text(markdown_table(args.preset, results, command))
    print(f"table: {args.work / 'results.md'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
