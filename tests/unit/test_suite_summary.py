# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The end of `make test`'s output (tests/tools/suite.py): a CI log shows only its tail,
so the tests that failed come last, a line each, after the table of parts."""

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
    failed = suite.Part(2, f"cat {tmp_path / 'out'}; exit 2")
    assert not suite._run_part(failed, ["bash", "-c"], time.monotonic())
    passed = suite.Part(1, "echo fine")
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
    assert out.index("make test: what each part took (lanes ran side by side)") > out.index(
        f"make test: the last {len(failed.tail)} lines of {failed.target}:"
    )


def test_a_suite_that_passed_names_no_test(capsys: pytest.CaptureFixture[str]) -> None:
    part = suite.Part(1, "echo 'FAILED is only a word here'")
    assert suite._run_part(part, ["bash", "-c"], time.monotonic())
    assert suite._summary([[part]], 1.0) == 0
    assert "failed in" not in capsys.readouterr().out
