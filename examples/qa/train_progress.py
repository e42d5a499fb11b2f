"""Keep fairseq-train's whole output in the run's log and show the terminal only how far the run is, with an
estimate of the time left (examples/qa/cpu_pretrained.sh pipes the fine-tuning through it).

    fairseq-train ... 2>&1 | python examples/qa/train_progress.py RUN.train.log UPDATES

Every line is appended to RUN.train.log. On the terminal: one line per fairseq log line that says how many updates
are done (the train_inner lines, every --log-interval updates, and the end of an epoch), "| update 140 of 700 (20 %),
loss 3.912, 9 min so far, about 36 min left", the estimate from this call's rate (a resumed run counts from where it
started); the warnings and errors (a traceback whole, to its end) pass through as they are, so that a failure is
seen where it happens.
"""

from __future__ import annotations

import re
import sys
import time

UPDATES = re.compile(r"\bnum_updates[= ](\d+)")
LOSS = re.compile(r"\bloss[= ]([\d.]+)")
SAID = re.compile(r"\| (WARNING|ERROR|CRITICAL) \||^Traceback|Error\b")


def progress_line(done: int, total: int, loss: str | None, seconds: float, rate: float | None) -> str:
    line = f"| update {done} of {total} ({100 * done // max(total, 1)} %)"
    if loss is not None:
        line += f", loss {loss}"
    line += f", {seconds / 60:.0f} min so far"
    if rate is not None and done < total:
        line += f", about {(total - done) / rate / 60:.0f} min left"
    return line


def main(argv: list[str]) -> None:
    if len(argv) != 2 or not argv[1].isdigit():
        sys.exit(__doc__)
    log_path, total = argv[0], int(argv[1])
    started, first = time.monotonic(), None  # the first update seen, and when: the rate of this call
    in_traceback = False
    with open(log_path, "a", encoding="utf-8") as log:
        for line in sys.stdin:
            log.write(line)
            log.flush()
            in_traceback = in_traceback or line.startswith("Traceback")
            found = UPDATES.search(line)
            if found and " | INFO | " in line:
                done, now = int(found.group(1)), time.monotonic()
                if first is None:
                    first = (done, now)
                rate = (done - first[0]) / (now - first[1]) if done > first[0] and now > first[1] else None
                loss = LOSS.search(line)
                print(progress_line(done, total, loss and loss.group(1), now - started, rate), flush=True)
            elif in_traceback or SAID.search(line):
                print(line, end="", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
