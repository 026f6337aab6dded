# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Shared helpers of the driver scenario's tests."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[3]
HELD = ("nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1", "libcuda1", "firmware-nvidia-gsp")
READY = "/run/nvidia/validations/driver-ready"
BLACKLIST = "/etc/modprobe.d/gpufleet-blacklist-nouveau.conf"


def held(host) -> set[str]:
    lines = host.check_output("dpkg --get-selections").splitlines()
    return {line.split()[0].split(":")[0] for line in lines if line.split()[-1] == "hold"}


def version(host, package: str) -> str:
    return host.check_output(f"dpkg-query -W -f='${{Version}}' {package}")


def converge(args: list[str], playbook: Path | None = None, expect_rc: int = 0) -> dict:
    """Run a playbook (the scenario's converge) with extra arguments; its JSON events."""
    env = dict(
        os.environ,
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(PROJECT / "collections"),
        ANSIBLE_ROLES_PATH=str(PROJECT / "roles"),
    )
    result = subprocess.run(
        [
            "ansible-playbook",
            *args,
            "-i",
            # The directory: molecule keeps host_vars and group_vars beside the file.
            os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"]),
            str(playbook or PROJECT / "molecule" / "driver" / "converge.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=PROJECT,
    )
    assert result.returncode == expect_rc, failures(result)
    return json.loads(result.stdout)


def failures(result: subprocess.CompletedProcess) -> str:
    """What the failed tasks said (their own words, not only the play's last lines)."""
    said = []
    try:
        plays = json.loads(result.stdout)["plays"]
    except (ValueError, KeyError):
        plays = []
    for play in plays:
        for task in play["tasks"]:
            for name, outcome in task["hosts"].items():
                if outcome.get("failed") or outcome.get("unreachable"):
                    words = {k: outcome.get(k) for k in ("msg", "rc", "stdout", "stderr")}
                    said.append(f"{name}: {task['task']['name']}: {json.dumps(words)[-3000:]}")
    return "\n".join([*said, result.stdout[-3000:], result.stderr[-2000:]])


@functools.cache
def check_mode_run() -> dict:
    """The driver stage in check mode on the converged nodes."""
    return converge(["--check"])


def stage(host) -> dict:
    return stage_of(check_mode_run(), host.backend.get_hostname())


def stage_of(run: dict, hostname: str, fact: str = "driver_stage") -> dict:
    for play in run["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get(hostname, {})
            facts = result.get("ansible_facts", {})
            if fact in facts:
                return facts[fact]
    raise AssertionError(f"no {fact} for {hostname}")
