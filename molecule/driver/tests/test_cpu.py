# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""CPU-only node: the driver stage changes nothing."""

from __future__ import annotations

from helpers import BLACKLIST

testinfra_hosts = ["podman://gpufleet-drv-cpu"]


def test_nothing_of_the_driver_stage_is_there(host):
    assert not host.file(BLACKLIST).exists
    assert not host.file("/etc/apt/sources.list.d/zz-gpufleet-debian-nvidia.sources").exists
    assert not host.file("/run/nvidia").exists
    assert not host.exists("nvidia-smi")
