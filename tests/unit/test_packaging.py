# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The controller's wheel (`make dist`): the runner package with, as package data,
exactly what the playbooks run, so that an installed controller plans a host as a
checkout would (the same project hash, so the same desired state)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import PROJECT
from runner.desired import project_files, project_hash


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist)]
    subprocess.run([*build, str(PROJECT)], check=True, capture_output=True)
    (wheel,) = dist.glob("gpufleet-*.whl")
    target = dist / "unpacked"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    return target


def test_the_wheel_carries_what_the_playbooks_run(unpacked: Path):
    packaged = unpacked / "runner" / "project"
    ours = [str(path.relative_to(PROJECT)) for path in project_files(PROJECT)]
    theirs = [str(path.relative_to(packaged)) for path in project_files(packaged)]
    assert theirs == ours
    assert project_hash(packaged) == project_hash(PROJECT)


def test_the_wheel_has_the_console_script_and_no_simulation(unpacked: Path):
    (info,) = unpacked.glob("gpufleet-*.dist-info")
    assert "gpufleet = runner.cli:main" in (info / "entry_points.txt").read_text()
    names = {str(p.relative_to(unpacked)) for p in unpacked.rglob("*") if p.is_file()}
    assert not [n for n in names if n.startswith(("tests/", "inventories/", "molecule/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "runner/systemd/gpufleet-reconcile.service" in names
    # Not part of the project's hash (it changes nothing on a node), so named here.
    assert "runner/project/playbooks/callback_plugins/gpufleet_module_cache.py" in names


def test_the_wheel_declares_the_licence_and_carries_its_text(unpacked: Path):
    (info,) = unpacked.glob("gpufleet-*.dist-info")
    metadata = (info / "METADATA").read_text()
    assert "License-Expression: GPL-3.0-or-later" in metadata.splitlines()
    assert "License-File: LICENSE" in metadata.splitlines()
    assert (info / "licenses" / "LICENSE").read_text() == (PROJECT / "LICENSE").read_text()
