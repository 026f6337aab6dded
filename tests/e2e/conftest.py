# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Make the simulation's tools (tests/sim: the fleet and the test control plane)
importable; the session's onboarded node that later modules start copies of, and its
controller installed from the wheel, which the modules that play a site share."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parents[1] / "sim"
if str(SIM) not in sys.path:
    sys.path.insert(0, str(SIM))


# Modules whose subject comes after onboarding (a rollout, a kernel update) start their
# nodes as copies of one node onboarded once per session, instead of onboarding each
# anew: onboarding itself is the subject of test_runner_e2e's first cycle (and of the
# fixture below, which asserts it).
BARE_T4 = "e2e-bare-t4"


@pytest.fixture(scope="session")
def bare_t4_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The disk of a simulated T4 that runs no containers (a Slurm site's node, say:
    gpufleet_containers false), onboarded by one reconcile cycle, as a podman image;
    yields its tag for start_fleet(from_snapshot=...)."""
    from test_runner_e2e import FLEET, NO_CONTAINERS, Fleet, start_fleet

    work = tmp_path_factory.mktemp("bare-t4")
    inventory = start_fleet(work, {BARE_T4: "t4-1"})
    (inventory / "bare.yml").write_text(NO_CONTAINERS)
    tag = ""
    try:
        fleet = Fleet(inventory, work / "state")
        first = fleet.runner("reconcile", "--once")
        assert f"{BARE_T4}: applied" in first.stdout, first.stdout + first.stderr
        record = fleet.status()[BARE_T4]
        assert record["status"] == "converged", record
        # Shut down cleanly first: the copies boot as this node would after a reboot.
        subprocess.run(["podman", "stop", "-t", "10", BARE_T4], check=True)
        done = subprocess.run(
            [*FLEET, "snapshot", BARE_T4], check=True, capture_output=True, text=True
        )
        tag = done.stdout.strip()
        yield tag  # (the node stays stopped, and is removed with its image at the end)
    finally:
        subprocess.run([*FLEET, "down", BARE_T4], check=False)
        if tag:
            subprocess.run(["podman", "rmi", "--force", tag], check=False, capture_output=True)


@pytest.fixture(scope="session")
def installed_gpufleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpufleet's wheel, built from the checkout and installed offline into a virtualenv
    once per session (test_runner_e2e.installed_controller); the modules that run it
    as a site would only run it, so they share it."""
    from test_runner_e2e import installed_controller

    return installed_controller(tmp_path_factory.mktemp("installed"))
