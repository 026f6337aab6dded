# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The end-of-run report: one line per node, and a failed run when a stage failed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible_collections.gpufleet.nvidia.plugins.filter.summary import node_report, stage_failures
from conftest import PROJECT, run_ansible

FAILED = {"status": "failed", "reason": "Install the driver packages: no such version"}


def test_stage_failures_name_host_stage_and_reason():
    hosts = [
        {"inventory_hostname": "gpu-1", "driver_stage": FAILED},
        {"inventory_hostname": "gpu-2", "driver_stage": {"status": "ready", "reason": ""}},
        {"inventory_hostname": "cpu-1", "driver_stage": {"status": "not-a-gpu-node"}},
        {"inventory_hostname": "gone"},
    ]
    assert stage_failures(hosts) == [
        "gpu-1: driver failed: Install the driver packages: no such version"
    ]


def test_node_report_for_a_host_without_facts():
    assert node_report({"inventory_hostname": "gone"}) == (
        "gone: no facts (unreachable, or not part of this run)"
    )


def test_report_play_runs_and_fails_the_run_when_every_node_failed(tmp_path: Path):
    """The report play still runs when every node failed its stage, and fails the run."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        json.dumps(
            {
                "gpu_nodes": {
                    "hosts": {
                        "gpu-1": {"driver_stage": FAILED},
                        "gpu-2": {"driver_stage": dict(FAILED, reason="reboot timed out")},
                    }
                }
            }
        )
    )
    rc, report = run_ansible(
        "ansible-playbook",
        "-i",
        str(inventory),
        "-e",
        json.dumps({"ansible_python_interpreter": sys.executable}),
        str(PROJECT / "playbooks" / "report.yml"),
    )
    assert rc != 0
    tasks = report["plays"][0]["tasks"]
    # Once, on one of the hosts.
    assert len(tasks[0]["hosts"]) == 1
    (shown,) = tasks[0]["hosts"].values()
    lines = [item["msg"] for item in shown["results"]]
    assert lines == [
        "gpu-1: no facts (unreachable, or not part of this run)",
        "gpu-2: no facts (unreachable, or not part of this run)",
    ]
    failure = next(iter(tasks[1]["hosts"].values()))
    assert failure["failed"]
    assert failure["msg"] == [
        "gpu-1: driver failed: Install the driver packages: no such version",
        "gpu-2: driver failed: reboot timed out",
    ]
