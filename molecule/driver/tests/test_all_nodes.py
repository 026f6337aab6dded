# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""What every node of the driver scenario reports."""

from __future__ import annotations

from helpers import check_mode_run, stage

testinfra_hosts = [
    "podman://gpufleet-drv-h100",
    "podman://gpufleet-drv-t4",
    "podman://gpufleet-drv-a100",
    "podman://gpufleet-drv-l4",
    "podman://gpufleet-drv-cpu",
]
EXPECTED = {
    "gpufleet-drv-h100": "ready",
    "gpufleet-drv-t4": "reboot-required",
    "gpufleet-drv-a100": "ready",
    "gpufleet-drv-l4": "pre-installed",
    "gpufleet-drv-cpu": "not-a-gpu-node",
}


def test_check_mode_on_a_converged_fleet_predicts_no_change(host):
    stats = check_mode_run()["stats"][host.backend.get_hostname()]
    assert stats["changed"] == 0 and stats["failures"] == 0


def test_each_node_reports_its_driver_stage(host):
    result = stage(host)
    assert result["status"] == EXPECTED[host.backend.get_hostname()]
    expected_label = {
        "ready": "true",
        "reboot-required": "true",
        "pre-installed": "pre-installed",
        "not-a-gpu-node": "false",
    }
    assert result["deploy_label"] == expected_label[result["status"]]
    if result["status"] == "reboot-required":
        assert "reboot" in result["reason"]


def test_fabric_manager_only_where_there_are_nvswitches(host):
    installed = host.package("nvidia-fabricmanager-535").is_installed
    assert installed == (host.backend.get_hostname() == "gpufleet-drv-h100")
