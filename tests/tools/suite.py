# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run the test suite's parts in lanes side by side, then print what each part took.

    python tests/tools/suite.py --lane "lint unit molecule" --lane "e2e"

Each lane is a list of Makefile targets run one after another (`make TARGET`); lanes run
at the same time. The simulated nodes spend much of a run waiting (on systemd, on apt,
on a backoff), so two lanes keep two cores busier than one. Every line a part prints is
shown as it comes, prefixed with the part's name and the minutes and seconds since the
suite began (so a log says where the time went); a lane stops at its first failing part,
the other lanes go on, so one run reports every lane's failure, and the summary at the
end first repeats the last lines of each failed part (a log's tail then says why, even when
another lane went on printing long after), and ends with the tests that failed, a line
each. Parts that share something exclusive (the test control plane) take a lock for it
themselves.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
TAIL = 40  # lines of a failed part repeated in the summary
# pytest's short summary lines ("FAILED tests/x.py::test_y - why", "ERROR tests/x.py"
# for a module that could not be collected), kept for the summary.
_FAILED_TEST = re.compile(r"^(FAILED|ERROR) \S+\.py(::\S+)?( - |$)")


@dataclass
class Part:
    lane: int
    target: str
    result: str = "not run"
    seconds: float = 0.0
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL))
    failed_tests: list[str] = field(default_factory=list)


_print_lock = threading.Lock()


def _say(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def _run_part(part: Part, make: list[str], suite_started: float) -> bool:
    width = 16
    prefix = f"[{part.target}]".ljust(width)
    started = time.monotonic()
    process = subprocess.Popen(
        [*make, part.target],
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        bufsize=1,
    )
    assert process.stdout is not None
    for line in process.stdout:
        line = line.removesuffix(chr(10))
        if _FAILED_TEST.match(line):
            part.failed_tests.append(line[:160])
        line = f"{_clock(time.monotonic() - suite_started)} {line}"
        part.tail.append(line)
        _say(f"{prefix} {line}\n")
    returncode = process.wait()
    part.seconds = time.monotonic() - started
    part.result = "passed" if returncode == 0 else f"FAILED ({returncode})"
    return returncode == 0


def _run_lane(parts: list[Part], make: list[str], suite_started: float) -> None:
    for part in parts:
        if not _run_part(part, make, suite_started):
            return


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lane",
        action="append",
        required=True,
        metavar="TARGETS",
        help="Makefile targets run one after another (space-separated); repeat per lane",
    )
    args = parser.parse_args(argv)
    make = ["make", "--no-print-directory"]
    lanes = [
        [Part(index, target) for target in spec.split()]
        for index, spec in enumerate(args.lane, start=1)
    ]
    started = time.monotonic()
    threads = [threading.Thread(target=_run_lane, args=(lane, make, started)) for lane in lanes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _summary(lanes, time.monotonic() - started)


def _summary(lanes: list[list[Part]], wall: float) -> int:
    """Print the failed parts' last lines, each part's time and the failed tests; the
    suite's exit status."""
    parts = [part for lane in lanes for part in lane]
    for part in parts:
        if part.result.startswith("FAILED"):
            print(f"\nmake test: the last {len(part.tail)} lines of {part.target}:")
            print("\n".join(f"  {line}" for line in part.tail))
    print("\nmake test: what each part took (lanes ran side by side)")
    print(f"  {'lane':<5} {'part':<18} {'result':<12} {'time':>7}")
    for part in parts:
        print(f"  {part.lane:<5} {part.target:<18} {part.result:<12} {_minutes(part.seconds):>7}")
    for index, lane in enumerate(lanes, start=1):
        print(f"  lane {index}: {_minutes(sum(p.seconds for p in lane))}")
    print(f"  wall clock: {_minutes(wall)}")
    failed = [p.target for p in parts if p.result != "passed"]
    # Last, as a CI log's tail shows only the end: the tests that failed, a line each.
    for part in parts:
        if part.failed_tests:
            print(f"make test: {len(part.failed_tests)} failed in {part.target}:")
            print("\n".join(f"  {line}" for line in part.failed_tests))
    if failed:
        print(f"make test: FAILED or not run: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
