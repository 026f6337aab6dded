# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The device plugin (host service) and the exporter (host mode) on the converged node.

Runs before test_runtime.py (file order), on the node as converge left it.
"""

from __future__ import annotations

import json
import re

from helpers import PROJECT, converge

testinfra_hosts = ["gpufleet-rt-t4"]

SITE = PROJECT / "site.yml"
SCRAPE = (
    "python3 -c 'import urllib.request;"
    'print(urllib.request.urlopen("http://127.0.0.1:9400/metrics").read().decode())\''
)


def metrics(host) -> str:
    return host.check_output(SCRAPE)


def samples(text: str, name: str) -> list[str]:
    return re.findall(rf"(?m)^{name}\{{([^}}]*)\}} ", text)


def test_dcgm_and_the_exporter_run_as_services(host):
    assert host.service("nvidia-dcgm.service").is_running
    assert host.service("nvidia-dcgm-exporter.service").is_running
    assert host.service("nvidia-dcgm-exporter.service").is_enabled
    # The unit of NVIDIA's package, run with gpufleet's settings from a drop-in.
    assert host.package("datacenter-gpu-manager-exporter").is_installed
    unit = "nvidia-dcgm-exporter.service"
    fragment = host.check_output(f"systemctl show -P FragmentPath {unit}")
    assert fragment == f"/lib/systemd/system/{unit}"
    assert host.check_output(f"systemctl show -P DropInPaths {unit}") == (
        f"/etc/systemd/system/{unit}.d/gpufleet.conf"
    )
    pid = host.check_output(f"systemctl show -P MainPID {unit}")
    command = host.check_output(f"ps -o args= -p {pid}")
    assert "--remote-hostengine-info localhost:5555" in command, command
    assert host.socket("tcp://127.0.0.1:5555").is_listening


def test_every_gpu_reports_its_metrics(host):
    text = metrics(host)
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP"):
        found = samples(text, name)
        assert len(found) == 1, name  # the T4 profile has one GPU
        assert 'gpu="0"' in found[0]
        assert 'modelName="Tesla T4"' in found[0]


def test_the_exporter_restarts_when_its_collectors_change_and_not_otherwise(host):
    before = host.check_output("systemctl show -p MainPID --value nvidia-dcgm-exporter")
    collectors = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
    converge(["-e", json.dumps({"exporter_collectors": collectors})], SITE)
    custom = host.check_output("systemctl show -p MainPID --value nvidia-dcgm-exporter")
    assert custom != before
    text = metrics(host)
    assert samples(text, "DCGM_FI_DEV_GPU_UTIL")
    assert not samples(text, "DCGM_FI_DEV_FB_USED")  # only the configured field
    run = converge([], SITE)
    assert host.check_output("systemctl show -p MainPID --value nvidia-dcgm-exporter") != custom
    assert samples(metrics(host), "DCGM_FI_DEV_FB_USED")
    assert run["stats"]["gpufleet-rt-t4"]["changed"] > 0


def test_the_device_plugin_runs_on_the_host_with_the_chosen_sharing(host):
    assert host.service("nvidia-device-plugin.service").is_running
    assert host.file("/var/lib/kubelet/device-plugins/nvidia-gpu.sock").is_socket
    assert host.file("/run/nvidia/validations/plugin-ready").exists
    config = host.file("/etc/nvidia-device-plugin/config.yaml").content_string
    assert "timeSlicing" in config
    assert "replicas: 2" in config
    log = host.check_output("journalctl -u nvidia-device-plugin --no-pager")
    assert "1 GPUs x 2" in log
