# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The toolkit, runtime_config and validator stages on a node with containerd and Docker.

Tests run in order: each leaves the node converged for the next.
"""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from helpers import PROJECT, converge

testinfra_hosts = ["gpufleet-rt-t4"]

SITE = PROJECT / "site.yml"
TOOLKIT_PIN = "/etc/apt/preferences.d/gpufleet-nvidia-container-toolkit.pref"
FILES = PROJECT / "molecule" / "runtime" / "tests" / "files"
MARKERS = "/run/nvidia/validations"
TOOLKIT = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)


def outcome(run: dict, fact: str) -> dict:
    """The last value of a stage fact the run set."""
    found = None
    for play in run["plays"]:
        for task in play["tasks"]:
            facts = task["hosts"].get("gpufleet-rt-t4", {}).get("ansible_facts", {})
            found = facts.get(fact, found)
    assert found is not None, f"no {fact} in the run"
    return found


def containerd_dump(host) -> str:
    return host.check_output("containerd config dump")


def docker_runtimes(host) -> dict:
    return json.loads(host.check_output("docker info --format '{{json .Runtimes}}'"))


def main_pid(host, unit: str) -> str:
    return host.check_output(f"systemctl show -p MainPID --value {unit}")


def put_back_site_config(host) -> None:
    """The site's own containerd config, without our runtime: drift."""
    text = (FILES / "containerd-kubespray.toml").read_text()
    host.check_output(f"cat > /etc/containerd/config.toml <<'EOF'\n{text}EOF")


def test_both_runtimes_use_nvidia_and_keep_the_site_settings(host):
    dump = containerd_dump(host)
    nvidia = dump.split(".containerd.runtimes.nvidia.options]")[1].split("[plugins.")[0]
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in nvidia
    assert "SystemdCgroup = true" in nvidia  # copied from runc
    assert "runtimes.kata]" in dump
    assert 'sandbox_image = "registry.k8s.io/pause:3.9"' in dump
    config = host.file("/etc/containerd/config.toml").content_string
    assert config.startswith("# containerd configuration of this node (kubespray style).")
    assert 'default_runtime_name = "runc"' in config

    runtimes = docker_runtimes(host)
    assert runtimes["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"
    daemon = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert daemon["log-opts"] == {"max-size": "50m", "max-file": "3"}
    assert daemon["registry-mirrors"] == ["https://mirror.example.internal"]


def test_toolkit_pinned_held_and_cdi_spec_lists_the_gpu(host):
    selections = host.check_output("dpkg --get-selections").split()
    for package in TOOLKIT:
        assert host.package(package).version.startswith("1.17.8-"), package
        assert selections[selections.index(package) + 1] == "hold", package
    listed = host.check_output("nvidia-ctk cdi list").splitlines()
    assert "nvidia.com/gpu=0" in listed and "nvidia.com/gpu=all" in listed
    assert_uvm_in_the_spec(host)
    # 1.17 ships no CDI refresh units.
    assert not host.file("/etc/systemd/system/nvidia-cdi-refresh.service.d/gpufleet.conf").exists


def test_markers_and_check_mode_changes_nothing(host):
    assert host.file(f"{MARKERS}/driver-ready").exists
    assert host.file(f"{MARKERS}/toolkit-ready").exists
    assert not host.file(f"{MARKERS}/cuda-ready").exists
    run = converge(["--check"], SITE)
    assert run["stats"]["gpufleet-rt-t4"]["changed"] == 0
    validator = outcome(run, "validator_stage")
    assert validator["status"] == "ready"
    # toolkit-ready came from nvidia-smi in a container that NVIDIA's runtime edited
    # from the CDI spec (the container's root has no NVIDIA file of its own).
    assert validator["toolkit"] == (
        "nvidia-smi in a container through /usr/bin/nvidia-container-runtime"
        " (NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all)"
    )
    assert validator["cuda"].startswith("skipped: no CUDA sample configured")


def test_drift_is_repaired_and_only_the_drifted_runtime_restarts(host):
    put_back_site_config(host)
    assert "runtimes.nvidia]" not in containerd_dump(host)
    containerd_before, docker_before = main_pid(host, "containerd"), main_pid(host, "docker")

    run = converge([], SITE)
    assert outcome(run, "runtime_config_stage")["changed"] == ["containerd"]
    assert "runtimes.nvidia]" in containerd_dump(host)
    assert main_pid(host, "containerd") != containerd_before
    assert main_pid(host, "docker") == docker_before

    containerd_after = main_pid(host, "containerd")
    again = converge([], SITE)
    assert again["stats"]["gpufleet-rt-t4"]["changed"] == 0
    assert main_pid(host, "containerd") == containerd_after


def test_a_config_containerd_ignores_is_rolled_back(host):
    # containerd 1.6 loads a version 3 file without complaint and ignores its CRI
    # tables: the nvidia runtime would silently not exist.
    host.check_output("rm /etc/containerd/config.toml && systemctl restart containerd")
    # As JSON: -e NAME=VALUE would give the string "3", which the settings pass refuses.
    version_3 = json.dumps({"runtime_config_containerd_config_version": 3})
    run = converge(["-e", version_3], SITE, expect_rc=2)
    stage = outcome(run, "runtime_config_stage")
    assert stage["status"] == "failed"
    assert "containerd did not work with the new configuration" in stage["reason"]
    assert "io.containerd.grpc.v1.cri plugin" in stage["reason"]
    assert "was put back" in stage["reason"]
    assert not host.file("/etc/containerd/config.toml").exists
    assert host.service("containerd").is_running
    assert outcome(run, "validator_stage")["status"] == "not-reached"
    assert not host.file(f"{MARKERS}/toolkit-ready").exists
    assert host.file(f"{MARKERS}/driver-ready").exists

    put_back_site_config(host)
    converge([], SITE)
    assert host.file(f"{MARKERS}/toolkit-ready").exists


@pytest.mark.parametrize("name", ["nvidia gpu", "nv'idia"])
def test_a_bad_runtime_name_writes_nothing(host, name):
    before = host.file("/etc/containerd/config.toml").content_string
    run = converge(["-e", json.dumps({"runtime_config_runtime_name": name})], SITE, expect_rc=2)
    assert run["stats"]["gpufleet-rt-t4"]["changed"] == 0
    assert host.file("/etc/containerd/config.toml").content_string == before


# Stands in for a new nvidia-ctk that cannot write the CDI spec here: a diversion
# keeps the packaged binary beside it (dpkg installs every version's there).
CTK = "/usr/bin/nvidia-ctk"
FAILING_CTK = f"""#!/bin/sh
if [ "$1" = cdi ] && {CTK}.real --version | grep -q 'version 1.20.0'; then
  echo 'level=error msg="failed to generate CDI spec: test fault"' >&2
  exit 1
fi
exec {CTK}.real "$@"
"""


def test_a_toolkit_change_that_fails_is_rolled_back(host):
    """1.20.0's nvidia-ctk fails to generate the CDI spec: the stage puts the 1.17.8
    packages back from apt's cache, held, with their pin; the spec stays as it was."""
    spec = host.file("/etc/cdi/nvidia.yaml").content_string
    pin = host.file(TOOLKIT_PIN).content_string
    host.run_expect(
        [0],
        f"dpkg-divert --quiet --local --rename --divert {CTK}.real --add {CTK}"
        f" && printf %s {shlex.quote(FAILING_CTK)} > {CTK} && chmod 755 {CTK}",
    )
    try:
        run = converge(["-e", "toolkit_version=1.20.0"], SITE, expect_rc=2)
    finally:
        host.run_expect([0], f"rm -f {CTK} && dpkg-divert --quiet --local --rename --remove {CTK}")
    stage = outcome(run, "toolkit_stage")
    assert stage["status"] == "failed"
    assert stage["reason"].startswith("Ask nvidia-ctk for the CDI spec of the node's GPUs: ")
    assert "test fault" in stage["reason"]
    assert stage["reason"].endswith("; rolled back to 1.17.8")
    for package in TOOLKIT:
        assert host.package(package).version.startswith("1.17.8-"), package
    held = host.check_output("apt-mark showhold").split()
    assert set(TOOLKIT) <= set(held)
    assert host.file(TOOLKIT_PIN).content_string == pin
    assert host.file("/etc/cdi/nvidia.yaml").content_string == spec
    assert "version 1.17.8" in host.check_output("nvidia-ctk --version")


def assert_uvm_in_the_spec(host):
    """nvidia-uvm loaded by the stage's unit, its device files there and in the spec
    every container gets (as in a real H200's spec: tests/unit/fixtures/nvidia-ctk)."""
    assert host.service("gpufleet-nvidia-uvm.service").is_enabled
    assert host.service("gpufleet-nvidia-uvm.service").is_running
    assert host.run("test -c /dev/nvidia-uvm && test -c /dev/nvidia-uvm-tools").rc == 0
    spec = yaml.safe_load(host.file("/etc/cdi/nvidia.yaml").content_string)
    nodes = {node["path"] for node in spec["containerEdits"]["deviceNodes"]}
    # nvidia-modeset's as well where it exists: the unit's fallback, nvidia-ctk's
    # `system create-device-nodes --control-devices`, creates it with the others (in
    # one full run of the suite, not in a run of the scenario alone on the same code;
    # the cause is not yet found), and a real host can have it too.
    assert nodes - {"/dev/nvidia-modeset"} == {
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidiactl",
    }


def test_toolkit_upgrade_and_cdi_spec_follows_the_driver(host):
    assert "535.309.01" in host.file("/etc/cdi/nvidia.yaml").content_string
    run = converge(["-e", "toolkit_version=1.19.1", "-e", "driver_version=535.261.03"], SITE)
    assert outcome(run, "toolkit_stage")["version"] == "1.19.1"
    for package in TOOLKIT:
        assert host.package(package).version.startswith("1.19.1-"), package
    spec = host.file("/etc/cdi/nvidia.yaml").content_string
    assert "libnvidia-ml.so.535.261.03" in spec and "535.309.01" not in spec
    # The driver change unloaded nvidia-uvm with nvidia; the stage loaded it again.
    assert_uvm_in_the_spec(host)
    # What NVML in a container reaches the (simulated) driver through here.
    assert "containerPath: /run/nvidia-persistenced/socket" in spec
    # 1.19 ships the refresh units (NVIDIA's own, where its package puts them): enabled,
    # the watch running, and the service writing our spec path with its own commands.
    assert host.service("nvidia-cdi-refresh.path").is_enabled
    assert host.service("nvidia-cdi-refresh.path").is_running
    assert host.service("nvidia-cdi-refresh.service").is_enabled
    unit = host.check_output("systemctl show -P FragmentPath nvidia-cdi-refresh.service")
    assert unit == "/etc/systemd/system/nvidia-cdi-refresh.service"
    environment = host.check_output("systemctl show -P Environment nvidia-cdi-refresh.service")
    assert "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/etc/cdi/nvidia.yaml" in environment.split()
    assert "nvidia-ctk cdi generate" in host.check_output(
        "systemctl show -P ExecStart nvidia-cdi-refresh.service"
    )
    assert host.file(f"{MARKERS}/toolkit-ready").exists
    # NVIDIA's 1.19 runtime and hooks, the driver swapped under them.
    assert outcome(run, "validator_stage")["toolkit"].endswith(
        "(NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all)"
    )


def test_the_refresh_units_move_to_lib_with_1_20_and_stay_ours(host):
    """1.20.0, the default a new node gets, moved its refresh units from
    /etc/systemd/system to /lib/systemd/system (its package removes the old conffiles
    and enables the units through debhelper). Upgrading from 1.19.1 leaves both
    enabled, the watch running and the service writing our spec; a second run
    changes nothing."""
    run = converge(["-e", "toolkit_version=1.20.0"], SITE)
    assert outcome(run, "toolkit_stage")["version"] == "1.20.0"
    for package in TOOLKIT:
        assert host.package(package).version.startswith("1.20.0-"), package
    assert not host.file("/etc/systemd/system/nvidia-cdi-refresh.service").exists
    assert not host.file("/etc/systemd/system/nvidia-cdi-refresh.path").exists
    unit = host.check_output("systemctl show -P FragmentPath nvidia-cdi-refresh.service")
    assert unit in (
        "/lib/systemd/system/nvidia-cdi-refresh.service",
        "/usr/lib/systemd/system/nvidia-cdi-refresh.service",
    )
    assert host.service("nvidia-cdi-refresh.path").is_enabled
    assert host.service("nvidia-cdi-refresh.path").is_running
    assert host.service("nvidia-cdi-refresh.service").is_enabled
    environment = host.check_output("systemctl show -P Environment nvidia-cdi-refresh.service")
    assert "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/etc/cdi/nvidia.yaml" in environment.split()
    assert outcome(run, "validator_stage")["status"] == "ready"
    again = converge(["-e", "toolkit_version=1.20.0"], SITE)
    assert again["stats"]["gpufleet-rt-t4"]["changed"] == 0
