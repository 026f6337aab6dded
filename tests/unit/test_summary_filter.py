# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The report's one-line node summary."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.nvidia.plugins.filter.summary import (
    node_report,
    node_summary,
    ready_for,
)


def test_cpu_node():
    assert node_summary({"gpu_count": 0}) == "not a GPU node (no NVIDIA device on the PCI bus)"


def test_hgx_node_with_loaded_open_driver():
    facts = {
        "gpu_count": 8,
        "gpus": [{"name": "NVIDIA H100 80GB HBM3"}],
        "nvswitch_count": 4,
        "driver": {"state": "loaded", "version": "550.127.05", "module_type": "open"},
        "nouveau_loaded": False,
    }
    assert node_summary(facts) == (
        "8x NVIDIA H100 80GB HBM3 + 4 NVSwitch; driver loaded 550.127.05 (open)"
    )


def test_fresh_node_still_on_nouveau():
    facts = {
        "gpu_count": 1,
        "gpus": [{"name": None}],
        "driver": {"state": "absent"},
        "nouveau_loaded": True,
    }
    assert node_summary(facts) == "1x unknown NVIDIA GPU; driver absent; nouveau loaded"


def test_a_stage_runs_only_where_every_earlier_stage_passed():
    host = {
        "driver_stage": {"status": "ready"},
        "mig_stage": {"status": "disabled"},
        "toolkit_stage": {"status": "pre-installed"},
    }
    assert ready_for(host, "driver")
    assert ready_for(host, "runtime_config")
    assert not ready_for({**host, "mig_stage": {"status": "failed"}}, "toolkit")
    assert not ready_for(host, "validator")  # runtime_config has not run
    assert not ready_for({"driver_stage": {"status": "reboot-required"}}, "toolkit")
    assert not ready_for({"driver_stage": {"status": "failed"}}, "toolkit")
    # A driver nobody manages counts once it answers.
    assert ready_for({"driver_stage": {"status": "unmanaged", "validated": True}}, "mig")
    assert not ready_for({"driver_stage": {"status": "unmanaged", "validated": False}}, "mig")


def test_an_unknown_stage_is_an_error():
    with pytest.raises(ValueError, match="unknown stage 'slurm'"):
        ready_for({}, "slurm")


def test_report_names_the_furthest_validated_stage():
    host = {
        "inventory_hostname": "n1",
        "ansible_facts": {
            "gpufleet": {"gpu_count": 1, "gpus": [{"name": "Tesla T4"}], "driver": {}}
        },
        "driver_stage": {"status": "ready"},
        "toolkit_stage": {"status": "failed", "reason": "no repository"},
        "validator_stage": {"status": "not-reached", "reason": "an earlier stage did not pass"},
    }
    assert node_report(host) == (
        "n1: 1x Tesla T4; driver unknown; driver: ready; toolkit: failed (no repository); "
        "validator: not-reached (an earlier stage did not pass); validated up to: driver"
    )
    host["driver_stage"] = {"status": "reboot-required", "reason": "reboot"}
    assert node_report(host).endswith("; nothing validated")
