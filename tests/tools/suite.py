# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run the test suite's parts on two workers side by side, then print what each took.

    python tests/tools/suite.py --workers 2 --job "molecule-nodes" --job "unit lint"

Each job is a list of Makefile targets run one after another (`make TARGET`); the
workers take the jobs in the order given, each the next one as soon as it is free, so
the longest jobs should come first. The simulated nodes spend much of a run waiting (on
systemd, on apt, on a backoff), so two workers keep two cores busier than one; taking
jobs from one queue, rather than from fixed lanes, evens out an hour in which one part
runs slower than its last time. Every line a part prints is shown as it comes,
prefixed with the part's name and the minutes and seconds since the suite began (so a
log says where the time went); a job stops at its first failing part, the other jobs go
on, so one run reports every job's failure, and the summary at the end first repeats
the last lines of each failed part (a log's tail then says why, even when other parts
went on printing long after), and ends with the tests that failed, a line each. Parts
that share something exclusive (the test control plane) belong in one job, or take a
lock for it themselves.
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
    target: str
    worker: int = 0  # the worker that ran it (0: not run)
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


def _work(worker: int, jobs: collections.deque[list[Part]], make: list[str], start: float) -> None:
    """Take jobs from the shared queue until it is empty; a job's parts run in order, up
    to the first that fails."""
    while True:
        try:
            job = jobs.popleft()  # (atomic: the workers share the deque without a lock)
        except IndexError:
            return
        for part in job:
            part.worker = worker
            if not _run_part(part, make, start):
                break


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--job",
        action="append",
        required=True,
        metavar="TARGETS",
        help="Makefile targets run one after another (space-separated); repeat per job,"
        " longest first",
    )
    parser.add_argument("--workers", type=int, default=2, help="jobs run at once (2)")
    args = parser.parse_args(argv)
    make = ["make", "--no-print-directory"]
    jobs = [[Part(target) for target in spec.split()] for spec in args.job]
    queue = collections.deque(jobs)
    started = time.monotonic()
    threads = [
        threading.Thread(target=_work, args=(worker, queue, make, started))
        for worker in range(1, args.workers + 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _summary(jobs, time.monotonic() - started)


def _summary(jobs: list[list[Part]], wall: float) -> int:
    """Print the failed parts' last lines, each part's time and the failed tests; the
    suite's exit status."""
    parts = [part for job in jobs for part in job]
    for part in parts:
        if part.result.startswith("FAILED"):
            print(f"\nmake test: the last {len(part.tail)} lines of {part.target}:")
            print("\n".join(f"  {line}" for line in part.tail))
    print("\nmake test: what each part took (workers ran side by side)")
    print(f"  {'worker':<7} {'part':<18} {'result':<12} {'time':>7}")
    for part in parts:
        worker = str(part.worker or "-")
        print(f"  {worker:<7} {part.target:<18} {part.result:<12} {_minutes(part.seconds):>7}")
    for worker in sorted({part.worker for part in parts if part.worker}):
        busy = sum(part.seconds for part in parts if part.worker == worker)
        print(f"  worker {worker}: {_minutes(busy)}")
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
