# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""L4 node whose driver was installed outside any package manager."""

from __future__ import annotations

from helpers import BLACKLIST, READY

testinfra_hosts = ["podman://gpufleet-drv-l4"]


def test_no_package_and_no_file_of_ours(host):
    installed = host.run(
        "dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' 'nvidia-*' 'libnvidia-*' 'libcuda*'"
    ).stdout.splitlines()
    assert [line for line in installed if line[1:2] == "i"] == []
    assert not host.file(BLACKLIST).exists
    assert not host.file("/etc/apt/sources.list.d/zz-gpufleet-debian-nvidia.sources").exists


def test_preinstalled_driver_still_answers_and_is_marked_ready(host):
    out = host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert out == "550.127.05"
    assert host.file(READY).exists
    # What NVIDIA's installer puts in place: its nvidia-smi and libnvidia-ml.so.1.
    assert host.file("/usr/bin/nvidia-smi").exists
    assert host.run("dpkg -S /usr/bin/nvidia-smi").rc == 1  # no package owns it
