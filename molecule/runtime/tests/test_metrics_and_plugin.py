# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The device plugin (host service) and the exporter (host mode) on the converged node.

Runs before test_runtime.py (file order), on the node as converge left it.
"""

from __future__ import annotations

import json
import re

from helpers import PROJECT, converge, stage_of

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


# A dcgm-exporter of another origin, packaged as some vendors' repositories carry one
# (built from NVIDIA's source under the name dcgm-exporter): the same program path.
SITE_EXPORTER = """
set -e
root=$(mktemp -d)
mkdir -p "$root/DEBIAN" "$root/usr/bin"
printf '#!/bin/sh\\necho the site exporter\\n' > "$root/usr/bin/dcgm-exporter"
chmod 755 "$root/usr/bin/dcgm-exporter"
cat > "$root/DEBIAN/control" <<END
Package: dcgm-exporter
Version: 3.3.9-1
Architecture: all
Maintainer: site
Description: the site exporter
END
dpkg-deb --build "$root" /tmp/site-dcgm-exporter.deb >/dev/null
dpkg --install /tmp/site-dcgm-exporter.deb
"""


def test_an_exporter_of_another_origin_is_left_in_place_and_named(host):
    """Where NVIDIA's exporter package is not installed but a package of another
    origin has put /usr/bin/dcgm-exporter there, the stage stops before any change,
    naming the file, its package and the ways on (check mode says the same); once the
    site removes its package, the next run installs NVIDIA's again and it serves."""
    host.run_expect([0], "dpkg --remove datacenter-gpu-manager-exporter")
    host.run_expect([0], SITE_EXPORTER)
    try:
        for mode in (["--check"], []):  # check mode predicts the refusal
            refused = converge(mode, SITE, expect_rc=2)
            outcome = stage_of(refused, "gpufleet-rt-t4", "exporter_stage")
            assert outcome["status"] == "failed", outcome
            assert (
                "/usr/bin/dcgm-exporter is there from package dcgm-exporter, not from "
                "datacenter-gpu-manager-exporter; gpufleet does not replace"
            ) in outcome["reason"], outcome["reason"]
            assert "exporter_mode: none" in outcome["reason"]
            assert refused["stats"]["gpufleet-rt-t4"]["changed"] == 0
        assert host.check_output("/usr/bin/dcgm-exporter") == "the site exporter"
        assert not host.package("datacenter-gpu-manager-exporter").is_installed
    finally:
        host.run_expect([0], "dpkg --purge dcgm-exporter")
    converge([], SITE)
    assert host.package("datacenter-gpu-manager-exporter").is_installed
    assert host.service("nvidia-dcgm-exporter.service").is_running
    assert samples(metrics(host), "DCGM_FI_DEV_GPU_UTIL")


def test_the_device_plugin_runs_on_the_host_with_the_chosen_sharing(host):
    assert host.service("nvidia-device-plugin.service").is_running
    assert host.file("/var/lib/kubelet/device-plugins/nvidia-gpu.sock").is_socket
    assert host.file("/run/nvidia/validations/plugin-ready").exists
    config = host.file("/etc/nvidia-device-plugin/config.yaml").content_string
    assert "timeSlicing" in config
    assert "replicas: 2" in config
    log = host.check_output("journalctl -u nvidia-device-plugin --no-pager")
    assert "1 GPUs x 2" in log
