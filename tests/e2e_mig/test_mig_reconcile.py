# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The MIG stage under the reconciler, on one simulated node with two A100s.

Not part of `make test` (CI's time budget): run with `make e2e-mig`. The tests run in
order on one node: the first cycle lays the GPUs out as `all-balanced`; instances
destroyed by hand are `mig` drift, put back through the rollout; a new layout is rolled
out; a second pass changes nothing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from test_runner_e2e import FLEET, Fleet, start_fleet

NODE = "mig-a100"
# all-balanced on an A100 40GB: two 1g.5gb, one 2g.10gb and one 3g.20gb per GPU.
BALANCED = ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("e2e-mig")
    inventory = start_fleet(work, {NODE: "a100-pcie-2"})
    (inventory / "host_vars").mkdir()
    _layout(inventory, "all-balanced")
    try:
        yield Fleet(inventory, work / "state")
    finally:
        subprocess.run([*FLEET, "down", NODE], check=False)


def _layout(inventory: Path, name: str) -> None:
    (inventory / "host_vars" / f"{NODE}.yml").write_text(
        f"mig_config: {name}\ndevice_plugin_mig_strategy: mixed\n"
    )


def _mig_devices(fleet: Fleet) -> list[list[str]]:
    """Per GPU, the sorted profiles of its MIG devices as nvidia-smi -L lists them."""
    gpus: list[list[str]] = []
    for line in fleet.on_node(NODE, "nvidia-smi", "-L").stdout.splitlines():
        if line.startswith("GPU "):
            gpus.append([])
        elif line.strip().startswith("MIG "):
            gpus[-1].append(line.split()[1])
    return [sorted(profiles) for profiles in gpus]


def test_the_first_cycle_lays_the_gpus_out(fleet: Fleet):
    result = fleet.reconcile("--once")
    record = fleet.status()[NODE]
    assert (record["status"], record["mig_layout"]) == ("converged", "all-balanced"), record
    assert _mig_devices(fleet) == [BALANCED, BALANCED], result.stdout
    listed = fleet.runner("status").stdout
    assert "mig=ready:all-balanced" in listed, listed


def test_instances_destroyed_by_hand_are_found_and_rolled_back_in(fleet: Fleet):
    """The probe sees GPU 0's instances gone (mig drift); putting them back stops what
    runs on the GPUs, so the repair goes through the rollout like a driver change."""
    for command in (["-dci", "-i", "0"], ["-dgi", "-i", "0"]):
        destroyed = fleet.on_node(NODE, "nvidia-smi", "mig", *command)
        assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert _mig_devices(fleet) == [[], BALANCED]
    result = fleet.reconcile("--once")
    assert f"{NODE}: rolled-out; because drift; repaired mig" in result.stdout, result.stdout
    assert _mig_devices(fleet) == [BALANCED, BALANCED]
    history = fleet.history(NODE)
    drift = [e for e in history if e["kind"] == "drift"]
    assert drift and drift[-1]["component"] == "mig"
    phases = [e["component"] for e in history if e["kind"] == "rollout"]
    assert phases[-4:] == ["queued", "applying", "applied", "done"]


def test_a_new_layout_is_rolled_out_and_a_second_pass_changes_nothing(fleet: Fleet):
    _layout(fleet.inventory, "all-1g.5gb")
    result = fleet.reconcile("--once")
    assert f"{NODE}: rolled-out; because desired state changed" in result.stdout, result.stdout
    assert _mig_devices(fleet) == [["1g.5gb"] * 7] * 2
    assert fleet.status()[NODE]["mig_layout"] == "all-1g.5gb"
    again = fleet.reconcile("--once")
    assert again.stdout.startswith("cycle: 1 probed, 0 planned, 0 applied"), again.stdout
