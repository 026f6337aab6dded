# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""T4 node, driver_reboot_policy: never, driver_version pinned to 535.261.03.

Runs after test_all_nodes.py (pytest orders files by name): the reboot below would
change what the check-mode pass there reports.
"""

from __future__ import annotations

import subprocess
import time

from helpers import BLACKLIST, HELD, PROJECT, READY, converge, held, stage_of, version

testinfra_hosts = ["podman://gpufleet-drv-t4"]
# The stand-in of NVIDIA's CUDA repository (GPUFLEET_REPO, mounted on the node).
STANDIN_CUDA = "/srv/gpufleet-repo/cuda/repos/debian12/x86_64"


def test_pinned_version_is_installed_and_held(host):
    # Debian offers a newer 535 build; the pin keeps the requested one.
    assert version(host, "nvidia-kernel-dkms").startswith("535.261.03-")
    assert version(host, "nvidia-smi").startswith("535.261.03-")
    pin = host.file("/etc/apt/preferences.d/gpufleet-nvidia-driver.pref")
    assert pin.contains("^Pin: version 535.261.03-")
    assert set(HELD) <= held(host)
    assert host.file(BLACKLIST).exists


def test_node_waits_for_a_reboot_then_loads_the_driver(host):
    assert not host.file(READY).exists
    assert host.run("nvidia-smi").rc == 9  # installed, not loaded: nouveau holds the GPU
    subprocess.run(
        ["podman", "restart", "-t", "5", host.backend.get_hostname()],
        check=True,
        capture_output=True,
    )
    for _ in range(60):
        if host.run("systemctl is-system-running").stdout.strip() in ("running", "degraded"):
            break
        time.sleep(1)
    after = host.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert after.rc == 0 and after.stdout.strip() == "535.261.03"


def test_version_change_is_disruptive_and_done_in_place(host):
    """Move the (now loaded) driver to Debian's newer 535 build without a reboot; a
    fabric manager someone installed here (a node without NVSwitches) leaves in the
    same transaction."""
    name = host.backend.get_hostname()
    # (from the package file: no source of this node offers it)
    host.run_expect([0], f"dpkg -i {STANDIN_CUDA}/nvidia-fabricmanager-535_535.261.03-1_amd64.deb")
    assert host.package("nvidia-fabricmanager-535").is_installed
    # Check mode first: it predicts the replacement (the reconciler's plan relies on
    # it to roll the change out) and touches nothing.
    plan = converge(["--limit", name, "--check", "-e", "driver_version=535.309.01"])
    predicted = stage_of(plan, name)
    assert (predicted["status"], predicted["disruptive"]) == ("ready", True)
    said = [
        task["hosts"][name]["msg"]
        for play in plan["plays"]
        for task in play["tasks"]
        if task["task"]["name"].endswith("Predict the replacement of the loaded driver")
        and task["hosts"].get(name, {}).get("changed")
    ]
    assert said and "replace driver 535.261.03 (proprietary) with 535.309.01" in said[0]
    assert _loaded(host) == "535.261.03"
    run = converge(["--limit", name, "-e", "driver_version=535.309.01"])
    stage_result = stage_of(run, host.backend.get_hostname())
    assert stage_result["disruptive"] is True
    assert stage_result["status"] == "ready"
    out = host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert out == "535.309.01"
    assert version(host, "nvidia-kernel-dkms").startswith("535.309.01-")
    assert not host.package("nvidia-fabricmanager-535").is_installed
    assert host.service("nvidia-persistenced").is_running
    assert host.file(READY).exists


def _loaded(host) -> str:
    return host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader")


def test_a_version_no_repository_has_fails_the_run_and_leaves_the_driver_running(host):
    """Every host of the run fails (only this one): site.yml still reports, then fails."""
    name = host.backend.get_hostname()
    run = converge(
        ["--limit", name, "-e", "driver_version=535.999.99"],
        playbook=PROJECT / "site.yml",
        expect_rc=2,
    )
    assert stage_of(run, name)["status"] == "failed"
    report = run["plays"][-1]["tasks"]
    lines = [item["msg"] for item in report[0]["hosts"][name]["results"]]
    assert any(
        line.startswith(f"{name}: 1x Tesla T4") and "driver: failed (" in line for line in lines
    )
    failure = report[-1]["hosts"][name]
    assert failure["failed"]
    assert failure["msg"][0].startswith(
        f"{name}: driver failed: Check that the requested version is available: "
        "driver_version 535.999.99"
    )
    # Refused before anything was stopped: the old driver still serves.
    assert _loaded(host) == "535.309.01"
    assert host.service("nvidia-persistenced").is_running
    assert host.file(READY).exists


def test_kernel_module_type_switch_swaps_the_module_package(host):
    """Proprietary 535.309.01 → open 535.261.03 (Debian's only open build), in place."""
    name = host.backend.get_hostname()
    run = converge(
        ["--limit", name, "-e", "driver_version=535.261.03", "-e", "driver_kernel_module_type=open"]
    )
    result = stage_of(run, name)
    assert result["disruptive"] is True
    assert (result["status"], result["module_type"]) == ("ready", "open")
    assert _loaded(host) == "535.261.03"
    assert version(host, "nvidia-open-kernel-dkms").startswith("535.261.03-")
    gone = host.run("dpkg-query -W -f='${db:Status-Abbrev}' nvidia-kernel-dkms")
    assert not gone.stdout.startswith("ii")
    assert "nvidia-open-kernel-dkms" in held(host)
    assert "nvidia-kernel-dkms" not in held(host)
    assert host.service("nvidia-persistenced").is_running


def test_a_packaged_driver_is_adopted_while_the_settings_leave_it_unnamed(host):
    """The open 535.261.03 loaded now, with driver_version unset and the flavour left
    to auto: the defaults would install the proprietary module, but the node keeps the
    driver its packages installed. Check mode predicts no change to it, the apply
    makes none, and the stage says what it adopted."""
    name = host.backend.get_hostname()
    unnamed = ["--limit", name, "-e", '{"driver_version": ""}']
    planned = converge([*unnamed, "--check"])
    outcome = stage_of(planned, name)
    assert outcome["disruptive"] is False
    assert outcome["adopted"] == (
        "driver 535.261.03 (open) adopted as installed; "
        "the defaults would install branch 535 (proprietary)"
    )
    applied = converge(unnamed)
    outcome = stage_of(applied, name)
    assert (outcome["status"], outcome["module_type"]) == ("ready", "open")
    assert outcome["adopted"].startswith("driver 535.261.03 (open) adopted")
    assert _loaded(host) == "535.261.03"
    assert version(host, "nvidia-open-kernel-dkms").startswith("535.261.03-")
    assert "nvidia-open-kernel-dkms" in held(host)


def test_an_unknown_gpu_holder_stops_a_driver_swap_named_and_nothing_changes(host):
    """A driver swap while a process gpufleet does not know holds /dev/nvidia0.

    The role finds the holder before it stops anything, and stops there: no package
    changed, the GPU services it knows never stopped, the holder named. Once it is
    gone, the same run swaps the driver in place.
    """
    name = host.backend.get_hostname()
    # Named both: the open module loaded now would otherwise be kept (adopted).
    swap = ["--limit", name, "-e", "driver_version=535.309.01"]
    swap += ["-e", "driver_kernel_module_type=proprietary"]
    persistenced = host.check_output("systemctl show -p MainPID --value nvidia-persistenced")
    host.check_output(
        "systemd-run --unit=gpufleet-test-holder -p StandardInput=file:/dev/nvidia0 sleep 600"
    )
    try:
        pid = host.check_output("systemctl show -p MainPID --value gpufleet-test-holder")
        run = converge(swap)
        result = stage_of(run, name)
        assert result["status"] == "failed"
        assert (
            "the driver was not changed: "
            f"pid {pid} (/usr/bin/sleep 600) in gpufleet-test-holder.service holds GPU 0"
        ) in result["reason"]
        assert host.service("gpufleet-test-holder").is_running
        assert _loaded(host) == "535.261.03"
        assert version(host, "nvidia-open-kernel-dkms").startswith("535.261.03-")
        never_stopped = host.check_output("systemctl show -p MainPID --value nvidia-persistenced")
        assert never_stopped == persistenced != "0"
    finally:
        host.run("systemctl stop gpufleet-test-holder")
    run = converge(swap)
    assert (stage_of(run, name)["status"], _loaded(host)) == ("ready", "535.309.01")
    assert host.service("nvidia-persistenced").is_running
