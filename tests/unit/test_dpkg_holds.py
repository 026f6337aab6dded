# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The dpkg_holds module, run through Ansible on this host against the real dpkg, with a
database of its own (a temporary --admindir) so the host's packages are never touched."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import run_local_module

PACKAGES = {
    # name -> (selection, Multi-Arch)
    "nvidia-smi": ("install", None),
    "libnvidia-ml1": ("hold", "same"),
    "nvidia-kernel-dkms": ("install", None),
}


@pytest.fixture
def admindir(tmp_path: Path) -> Path:
    """A dpkg database with three installed packages (one multi-arch, held)."""
    (tmp_path / "updates").mkdir()
    (tmp_path / "info").mkdir()
    (tmp_path / "available").touch()
    stanzas = []
    for name, (selection, multi_arch) in PACKAGES.items():
        lines = [
            f"Package: {name}",
            f"Status: {selection} ok installed",
            "Maintainer: gpufleet tests <tests@example.org>",
            "Architecture: amd64",
            *([f"Multi-Arch: {multi_arch}"] if multi_arch else []),
            "Version: 535.309.01-0+deb12u1",
            "Description: a package of the test database",
        ]
        stanzas.append("\n".join(lines) + "\n")
    (tmp_path / "status").write_text("\n".join(stanzas))
    return tmp_path


def selections(admindir: Path) -> dict[str, str]:
    listed = subprocess.run(
        ["dpkg", f"--admindir={admindir}", "--get-selections"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()}


def holds(admindir: Path, names: list[str], *flags: str, hold: bool = True) -> dict:
    args = {"names": names, "hold": hold, "admindir": str(admindir)}
    return run_local_module("gpufleet.nvidia.dpkg_holds", args, *flags)


def test_only_the_packages_not_held_yet_are_changed_and_a_second_run_changes_nothing(admindir):
    first = holds(admindir, ["nvidia-smi", "libnvidia-ml1", "nvidia-kernel-dkms"])
    assert first["changed"] is True
    assert first["changed_packages"] == ["nvidia-kernel-dkms", "nvidia-smi"]
    assert first["selections"]["libnvidia-ml1"] == "hold"  # matched without its :amd64
    assert selections(admindir) == {
        "nvidia-smi": "hold",
        "libnvidia-ml1:amd64": "hold",
        "nvidia-kernel-dkms": "hold",
    }
    again = holds(admindir, ["nvidia-smi", "libnvidia-ml1", "nvidia-kernel-dkms"])
    assert (again["changed"], again["changed_packages"]) == (False, [])


def test_check_mode_predicts_the_change_and_makes_none(admindir):
    before = selections(admindir)
    predicted = holds(admindir, ["nvidia-smi", "libnvidia-ml1"], "--check", "--diff")
    assert (predicted["changed"], predicted["changed_packages"]) == (True, ["nvidia-smi"])
    assert predicted["diff"]["after"] == {"nvidia-smi": "hold", "libnvidia-ml1": "hold"}
    assert selections(admindir) == before


def test_releasing_sets_install_on_held_packages_only(admindir):
    released = holds(admindir, ["libnvidia-ml1:amd64", "nvidia-smi"], hold=False)
    assert released["changed_packages"] == ["libnvidia-ml1:amd64"]
    assert selections(admindir)["libnvidia-ml1:amd64"] == "install"
    assert holds(admindir, ["libnvidia-ml1", "nvidia-smi"], hold=False)["changed"] is False


def test_a_package_dpkg_does_not_know_counts_as_a_change_as_with_dpkg_selections(admindir):
    result = holds(admindir, ["nvidia-driver", "nvidia-smi"], "--check")
    assert result["selections"] == {"nvidia-driver": "unknown", "nvidia-smi": "install"}
    assert result["changed_packages"] == ["nvidia-driver", "nvidia-smi"]


def test_no_packages_is_no_change(admindir):
    assert holds(admindir, [])["changed"] is False


def hold_the_lock(admindir: Path, seconds: float) -> subprocess.Popen[str]:
    """Another program holding dpkg's frontend lock for `seconds`, as apt does; returns
    once the lock is taken."""
    holder = subprocess.Popen(
        [
            "python3",
            "-c",
            "import fcntl, sys, time\n"
            f"lock = open({str(admindir / 'lock-frontend')!r}, 'w')\n"
            "fcntl.lockf(lock, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            f"time.sleep({seconds})\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_a_lock_held_for_a_moment_is_waited_for(admindir):
    holder = hold_the_lock(admindir, 3)
    try:
        result = holds(admindir, ["nvidia-smi"])
    finally:
        holder.wait()
    assert result["changed"] is True, result
    assert selections(admindir)["nvidia-smi"] == "hold"


def test_a_lock_held_past_the_timeout_fails_naming_its_holder_and_changes_nothing(admindir):
    holder = hold_the_lock(admindir, 30)
    try:
        args = {"names": ["nvidia-smi"], "admindir": str(admindir), "lock_timeout": 2}
        result = run_local_module("gpufleet.nvidia.dpkg_holds", args)
    finally:
        holder.kill()
        holder.wait()
    assert result.get("failed") is True, result
    assert f"locked by another process with pid {holder.pid}" in result["msg"], result["msg"]
    assert selections(admindir)["nvidia-smi"] == "install"
