# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""A100 pair on Debian 13: the driver its own archive carries (550), open modules."""

from __future__ import annotations

import json

from helpers import READY, held, version

testinfra_hosts = ["podman://gpufleet-drv-a100"]
OPEN_HELD = {"nvidia-open-kernel-dkms", "nvidia-smi", "libnvidia-ml1", "libcuda1"}


def test_debian13s_own_550_open_driver_is_installed_and_held(host):
    assert host.file("/etc/debian_version").content_string.startswith("13.")
    for package in OPEN_HELD | {"firmware-nvidia-gsp"}:
        assert version(host, package).startswith("550.163.01-"), package
    assert OPEN_HELD | {"firmware-nvidia-gsp"} <= held(host)
    assert not host.package("nvidia-kernel-dkms").is_installed, "one module flavour only"
    # From Debian 13's non-free archive, not from NVIDIA's repository.
    policy = host.check_output("apt-cache policy nvidia-smi")
    installed_from = policy.split("*** 550.163.01-2", 1)[1].splitlines()[1]
    assert "trixie/non-free" in installed_from, policy


def test_the_node_rebooted_into_the_open_module_and_550s_nvidia_smi_reads_the_gpus(host):
    assert host.file(READY).exists
    loaded = json.loads(host.check_output("/opt/gpusim/bin/gpusim status --json"))
    assert loaded["driver_loaded"]["module_type"] == "open"
    # Debian 13's nvidia-smi 550 on the mock NVML: the PCI addresses come from
    # nvmlDeviceGetPciInfoExt, which the 535 builds do not call.
    rows = host.check_output(
        "nvidia-smi --query-gpu=driver_version,pci.bus_id,name --format=csv,noheader"
    ).splitlines()
    assert rows == [
        "550.163.01, 00000000:3B:00.0, NVIDIA A100-PCIE-40GB",
        "550.163.01, 00000000:AF:00.0, NVIDIA A100-PCIE-40GB",
    ]
