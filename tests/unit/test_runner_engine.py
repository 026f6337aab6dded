"""The runner judges stage outcomes as the collection's gating does."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.nvidia.plugins.filter import summary
from runner.engine import STAGES, HostRun, stage_passed

OUTCOMES = [
    {"status": "ready"},
    {"status": "pre-installed"},
    {"status": "disabled"},
    {"status": "unmanaged", "validated": True},
    {"status": "unmanaged", "validated": False},
    {"status": "failed", "reason": "no such version"},
    {"status": "reboot-required"},
]


@pytest.mark.parametrize("outcome", OUTCOMES, ids=lambda o: f"{o['status']}-{o.get('validated')}")
def test_stage_passed_agrees_with_the_collection(outcome):
    assert stage_passed(outcome) == summary.stage_passed(outcome)


def test_stages_are_the_collections():
    assert tuple(name for name, _fact in summary.STAGES) == STAGES


def test_an_answering_unmanaged_driver_is_no_failure():
    stages = {s: {"status": "ready"} for s in STAGES}
    stages["driver"] = {"status": "unmanaged", "validated": True}
    assert HostRun("a", stages=stages).succeeded
    stages["driver"] = {"status": "unmanaged", "validated": False, "reason": "no driver"}
    assert HostRun("a", stages=stages).failed_stage == ("driver", "no driver")
    assert HostRun("a", stages={"driver": {"status": "not-a-gpu-node"}}).succeeded
