# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""`make test`'s runner (tests/tools/suite.py): its workers take jobs from one queue, and
the end of its output comes last in a CI log's tail, so the tests that failed come
last, a line each, after the table of parts."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[2] / "tests" / "tools" / "suite.py"
spec = importlib.util.spec_from_file_location("gpufleet_suite", SUITE)
assert spec and spec.loader
suite = sys.modules["gpufleet_suite"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)

PYTEST_END = """\
tests/e2e/test_x.py .F.
=========================== short test summary info ============================
FAILED tests/e2e/test_x.py::test_b - AssertionError: the node is drained
ERROR tests/e2e/test_y.py::test_c - RuntimeError: no fleet
==================== 1 failed, 2 passed, 1 error in 3.00s ====================
"""


def test_the_failed_tests_end_the_output_a_line_each(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A part's output as pytest prints it, through a shell in place of make.
    (tmp_path / "out").write_text(PYTEST_END)
    failed = suite.Part(f"cat {tmp_path / 'out'}; exit 2")
    assert not suite._run_part(failed, ["bash", "-c"], time.monotonic())
    passed = suite.Part("echo fine")
    assert suite._run_part(passed, ["bash", "-c"], time.monotonic())
    capsys.readouterr()

    assert suite._summary([[passed], [failed]], 60.0) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-4:] == [
        "make test: 2 failed in " + failed.target + ":",
        "  FAILED tests/e2e/test_x.py::test_b - AssertionError: the node is drained",
        "  ERROR tests/e2e/test_y.py::test_c - RuntimeError: no fleet",
        "make test: FAILED or not run: " + failed.target,
    ]
    # The failed part's last lines still come first, before the table.
    assert out.index("make test: what each part took (workers ran side by side)") > out.index(
        f"make test: the last {len(failed.tail)} lines of {failed.target}:"
    )


def test_a_suite_that_passed_names_no_test(capsys: pytest.CaptureFixture[str]) -> None:
    part = suite.Part("echo 'FAILED is only a word here'")
    assert suite._run_part(part, ["bash", "-c"], time.monotonic())
    assert suite._summary([[part]], 1.0) == 0
    assert "failed in" not in capsys.readouterr().out


def test_workers_take_the_jobs_in_order_and_a_failure_stops_only_its_job(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Each part notes in a file when it starts; "sleep" parts hold their worker.
    def part(name: str, then: str = "true") -> str:
        return f"echo {name} >> {tmp_path / 'order'}; {then}"

    jobs = [
        [suite.Part(part("long", "sleep 1"))],
        [suite.Part(part("fails", "exit 3")), suite.Part(part("after-the-failure"))],
        [suite.Part(part("next"))],
        [suite.Part(part("last"))],
    ]
    queue = suite.collections.deque(jobs)
    workers = [
        suite.threading.Thread(target=suite._work, args=(n, queue, ["bash", "-c"], 0.0))
        for n in (1, 2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    # The worker not held by the long job takes all the others, in their order; the
    # failing part's job goes no further.
    order = (tmp_path / "order").read_text().split()
    assert "after-the-failure" not in order
    assert order.index("fails") < order.index("next") < order.index("last")
    held = jobs[0][0].worker
    assert held in (1, 2)
    assert [p.worker for job in jobs[1:] for p in job] == [3 - held, 0, 3 - held, 3 - held]
    assert [p.result for job in jobs for p in job] == [
        "passed", "FAILED (3)", "not run", "passed", "passed",
    ]  # fmt: skip
    assert suite._summary(jobs, 2.0) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"  worker {held}: 0m01s" in out
    assert out[-1].startswith("make test: FAILED or not run: ")
