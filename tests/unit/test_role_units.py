# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Systemd units the roles install as they are (roles/*/files), read by systemd itself.

Those written from templates run on the simulated nodes; these are checked here too
because a node may never start them in a test (the MPS shared-memory mount needs a
privileged node, see the README).
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
UNITS = sorted(
    p for p in PROJECT.glob("roles/*/files/*") if p.suffix in (".service", ".mount", ".timer")
)


def test_there_are_units_to_check():
    assert [p.name for p in UNITS] == ["run-nvidia-mps-shm.mount", "gpufleet-nvidia-uvm.service"]


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_accepts_the_unit(unit: Path, tmp_path: Path) -> None:
    shutil.copy(unit, tmp_path / unit.name)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / unit.name)],
        capture_output=True,
        text=True,
        check=False,
    )
    # systemd only warns about what it cannot parse: any output is a finding.
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")


@pytest.mark.parametrize("unit", [p for p in UNITS if p.suffix == ".mount"], ids=lambda p: p.name)
def test_a_mount_unit_is_named_after_its_path(unit: Path) -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(unit)
    where = parser["Mount"]["Where"]
    escaped = subprocess.run(
        ["systemd-escape", "--path", "--suffix=mount", where],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert escaped == unit.name
