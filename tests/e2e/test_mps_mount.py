# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The device_plugin role's mount of MPS's shared memory, on a privileged simulated node.

The simulated fleet's nodes are unprivileged containers, which cannot mount a tmpfs;
this one node is privileged (as the molecule `runtime` node is), so the role's own
task files run against systemd, which mounts, keeps and removes the tmpfs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
FLEET = [sys.executable, str(PROJECT / "tests" / "sim" / "fleet.py")]
NODE = "e2e-mps"
SHM = "/run/nvidia/mps/shm"

pytestmark = pytest.mark.fleet


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    image = subprocess.run([*FLEET, "image"], capture_output=True, text=True, check=True)
    _podman("rm", "-f", NODE, check=False)
    _podman(
        "run", "-d", "--name", NODE, "--hostname", NODE, "--privileged",
        "--systemd=always", image.stdout.strip(), "/sbin/init",
    )  # fmt: skip
    subprocess.run([*FLEET, "wait", NODE], check=True)
    try:
        yield NODE
    finally:
        _podman("rm", "-f", NODE, check=False)


def _play(tmp_path: Path, *tasks_from: str) -> dict:
    """Run task files of the role on the node, in order; the JSON report of the run."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        + "".join(
            "    - ansible.builtin.include_role:\n"
            f"        name: device_plugin\n        tasks_from: {name}\n"
            for name in tasks_from
        )
    )
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            *("-i", f"{NODE},", "-c", "containers.podman.podman"),
            *("-e", json.dumps({"ansible_python_interpreter": "/usr/bin/python3"})),
            str(playbook),
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"),
            "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        },
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    return json.loads(run.stdout)["stats"][NODE]


def _mount_options(node: str) -> str:
    found = _podman("exec", node, "findmnt", "-n", "-o", "FSTYPE,OPTIONS", SHM, check=False)
    return found.stdout.strip()


def test_mps_shared_memory_is_mounted_kept_and_removed(node: str, tmp_path: Path) -> None:
    assert _play(tmp_path, "mps.yml")["changed"] > 0
    fstype, options = _mount_options(node).split()
    assert fstype == "tmpfs"
    assert {"nosuid", "nodev", "noexec", "size=65536k"} <= set(options.split(","))
    enabled = _podman("exec", node, "systemctl", "is-enabled", "run-nvidia-mps-shm.mount")
    assert enabled.stdout.strip() == "enabled", "mounted again at boot"

    assert _play(tmp_path, "mps.yml")["changed"] == 0, "a second run changes nothing"

    # As main.yml does: look.yml reads what is there, mps-off.yml acts on it.
    assert _play(tmp_path, "look.yml", "mps-off.yml")["changed"] > 0
    assert _mount_options(node) == ""
    unit = "/etc/systemd/system/run-nvidia-mps-shm.mount"
    gone = _podman("exec", node, "test", "-e", unit, check=False)
    assert gone.returncode != 0
    assert _play(tmp_path, "look.yml", "mps-off.yml")["changed"] == 0
