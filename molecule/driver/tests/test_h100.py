# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""HGX H100 node, driver_reboot_policy: if_needed, newest 535 build."""

from __future__ import annotations

import re
import shlex
import subprocess
import time

from helpers import BLACKLIST, HELD, PROJECT, READY, converge, held, stage_of, version

from ansible_collections.gpufleet.nvidia.plugins.module_utils import smi

testinfra_hosts = ["podman://gpufleet-drv-h100"]


def test_debian_packages_are_installed_and_held(host):
    assert set(HELD) <= held(host)
    assert host.file(BLACKLIST).contains("^blacklist nouveau")
    assert not host.file("/etc/apt/preferences.d/gpufleet-nvidia-driver.pref").exists


def test_node_was_rebooted_into_a_validated_driver(host):
    assert len(smi.parse_list(host.check_output("nvidia-smi -L"))) == 8
    installed = version(host, "nvidia-kernel-dkms").split("-")[0]
    reported = host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert reported.splitlines() == [installed] * 8
    marker = dict(line.split("=", 1) for line in host.file(READY).content_string.split())
    assert marker["IS_HOST_DRIVER"] == "true" and marker["NVIDIA_DRIVER_ROOT"] == "/"


def test_nvidia_smi_is_debians_own_binary_on_the_mock_nvml(host):
    """The real tool answers; only NVML underneath is simulated."""
    binary = host.check_output('readlink -f "$(command -v nvidia-smi)"')
    assert binary == "/usr/lib/nvidia/current/nvidia-smi"
    assert host.check_output(f"dpkg -S {binary}").startswith("nvidia-smi: ")
    library = host.check_output("readlink -f /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    assert library == "/opt/gpusim/lib/libnvidia-ml.so.1"
    uuids = host.check_output("nvidia-smi --query-gpu=uuid --format=csv,noheader").splitlines()
    # (-L lists the MIG devices laid out by the MIG stage under their GPUs.)
    assert list(smi.parse_list(host.check_output("nvidia-smi -L"))) == uuids
    # One device file per GPU, plus the control device and MIG's capabilities.
    for path in ["/dev/nvidiactl", *(f"/dev/nvidia{i}" for i in range(8))]:
        assert host.run(f"test -c {path}").rc == 0, path
    assert host.file("/dev/nvidia-caps/nvidia-cap1").exists
    # The driver's list of MIG capability minors, which nvidia-ctk reads for MIG devices.
    assert host.file("/proc/driver/nvidia-caps/mig-minors").contains("^gpu7/gi0/access ")


def test_only_the_fabric_manager_comes_from_the_cuda_repository(host):
    # The stand-in CUDA repository offers a 580 nvidia-kernel-dkms; Debian's 535 wins.
    policy = host.check_output("apt-cache policy nvidia-kernel-dkms")
    assert "580.95.05-1" in policy
    assert version(host, "nvidia-kernel-dkms").startswith("535.")
    # apt-cache policy prints each version with its pin priority: -1, never installed.
    assert "580.95.05-1 -1" in " ".join(policy.split())


def test_persistence_daemon_and_fabric_manager_run(host):
    for unit in ("nvidia-persistenced", "nvidia-fabricmanager"):
        assert host.service(unit).is_enabled and host.service(unit).is_running
    assert "nvidia-fabricmanager-535" in held(host)
    modes = host.check_output("nvidia-smi --query-gpu=persistence_mode --format=csv,noheader")
    assert set(modes.splitlines()) == {"Enabled"}
    # Both hold the GPUs, so the module cannot go while they run.
    unload = host.run("modprobe -r nvidia")
    assert unload.rc == 1 and "Module nvidia is in use" in unload.stderr


H100 = "gpufleet-drv-h100"
BALANCED = ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
DROP_INS = "/etc/systemd/system/nvidia-mig-manager.service.d"


def test_the_mig_stage_laid_the_gpus_out_with_nvidias_mig_parted(host):
    """mig_config: all-balanced on eight H100 80GB: each GPU holds two 1g.10gb, one
    2g.20gb and one 3g.40gb instance, as nvidia-smi (on the mock NVML) lists them."""
    assert _mig_devices(host) == [BALANCED] * 8
    assert host.package("nvidia-mig-manager").is_installed
    assert "v0.10.0" in host.check_output("nvidia-mig-parted --version")
    # The GPU consumers stopped for the change run again.
    assert host.service("nvidia-persistenced").is_running
    assert host.service("nvidia-fabricmanager").is_running
    # Each instance's capability device files (a GPU and a compute instance each).
    assert len(host.check_output("ls /dev/nvidia-caps").split()) == 2 + 2 * 4 * 8


def test_upstreams_service_is_set_to_apply_the_layout_at_boot(host):
    assert host.service("nvidia-mig-manager").is_enabled
    environment = host.check_output("systemctl show -p Environment nvidia-mig-manager")
    assert "MIG_PARTED_SELECTED_CONFIG=all-balanced" in environment
    assert "MIG_PARTED_CONFIG_FILE=/etc/nvidia-mig-manager/gpufleet-config.yaml" in environment
    # The selection in the form upstream's apply-start hook writes it.
    assert host.file(f"{DROP_INS}/override.conf").content_string == (
        '[Service]\nEnvironment="MIG_PARTED_SELECTED_CONFIG=all-balanced"\n'
    )


def test_instances_destroyed_by_hand_are_predicted_then_restored(host):
    host.check_output("nvidia-smi mig -dci -i 0 && nvidia-smi mig -dgi -i 0")
    assert _mig_devices(host)[0] == []

    planned = converge(["--check", "--limit", "gpufleet-drv-h100"])
    assert planned["stats"]["gpufleet-drv-h100"]["changed"] > 0
    assert stage_of(planned, "gpufleet-drv-h100", "mig_stage")["disruptive"]
    assert _mig_devices(host)[0] == []  # check mode changed nothing

    applied = converge(["--limit", "gpufleet-drv-h100"])
    outcome = stage_of(applied, "gpufleet-drv-h100", "mig_stage")
    assert outcome["status"] == "ready" and outcome["changed"]
    assert _mig_devices(host) == [BALANCED] * 8


def test_a_gpu_held_by_an_unknown_process_stops_the_change_naming_it(host):
    """Any process holding a GPU other than the GPU services the stage knows is named
    before anything is stopped; the layout, the GPUs and the services stay as they were
    (the known services never stopped)."""
    persistenced = host.check_output("systemctl show -p MainPID --value nvidia-persistenced")
    host.check_output(
        "systemd-run --unit=gpufleet-test-holder -p StandardInput=file:/dev/nvidia0 sleep 900"
    )
    try:
        pid = host.check_output("systemctl show -p MainPID --value gpufleet-test-holder")
        refused = converge(["--limit", H100, "-e", "mig_config=all-disabled"])
        outcome = stage_of(refused, H100, "mig_stage")
        assert outcome["status"] == "failed"
        holder = f"pid {pid} (/usr/bin/sleep 900) in gpufleet-test-holder.service holds GPU 0"
        assert holder in outcome["reason"]
        assert _mig_devices(host) == [BALANCED] * 8
        assert set(_mig_modes(host)) == {("Enabled", "Enabled")}
        never_stopped = host.check_output("systemctl show -p MainPID --value nvidia-persistenced")
        assert never_stopped == persistenced != "0"
    finally:
        host.run("systemctl stop gpufleet-test-holder")


def test_a_layout_change_that_fails_half_way_puts_the_previous_layout_back(host):
    """NVML fails the next GPU instance made on GPU 7 (a fault of the simulation's):
    mig-parted has laid out GPUs 0-6 anew when it stops. The stage applies the layout
    it exported before the change, so every GPU holds the one it had, and says so."""
    host.run_expect([0], "/opt/gpusim/bin/gpusim fault gi-create-error --gpu 7")
    failed = converge(["--limit", H100, "-e", "mig_config=all-1g.10gb"])
    outcome = stage_of(failed, H100, "mig_stage")
    assert outcome["status"] == "failed"
    said = re.match(
        r"Fail when mig-parted could not apply the layout: nvidia-mig-parted apply "
        r"all-1g\.10gb failed on gpufleet-drv-h100 \(exit \d+\), and the previous "
        r"layout was put back: (.*)",
        outcome["reason"],
    )
    assert said, outcome["reason"]
    # mig-parted's own error lines, not its warnings.
    assert "WARNING" not in said[1], said[1]
    assert "Error creating GPU instance for '1g.10gb': ERROR_UNKNOWN" in said[1]
    assert _mig_devices(host) == [BALANCED] * 8
    assert host.service("nvidia-persistenced").is_running


def test_a_mode_change_waiting_for_a_reset_waits_for_a_reboot(host):
    """MIG turned off by hand while the GPU was held stays pending until a reset. Under
    driver_reboot_policy never the stage stops at reboot-required (on every run, changing
    nothing); under if_needed it reboots, and upstream's service lays the GPUs out at boot."""
    host.check_output(
        "systemd-run --unit=gpufleet-test-holder -p StandardInput=file:/dev/nvidia0 sleep 900"
    )
    host.check_output("nvidia-smi mig -dci -i 0 && nvidia-smi mig -dgi -i 0")
    host.run("nvidia-smi -i 0 -mig 0")  # warns: pending, in use by another client
    host.check_output("systemctl stop gpufleet-test-holder")
    assert _mig_modes(host)[0] == ("Enabled", "Disabled")

    disable = ["--limit", H100, "-e", "mig_config=all-disabled"]
    waiting = converge([*disable, "-e", "driver_reboot_policy=never"])
    outcome = stage_of(waiting, H100, "mig_stage")
    assert outcome["status"] == "reboot-required", outcome
    assert "GPU 0 waits for a GPU reset" in outcome["reason"]
    assert _mig_modes(host)[0] == ("Enabled", "Disabled")

    # Waiting changes nothing, and check mode predicts exactly that.
    for mode in ([], ["--check"]):
        again = converge([*disable, "-e", "driver_reboot_policy=never", *mode])
        assert stage_of(again, H100, "mig_stage")["status"] == "reboot-required"
        assert again["stats"][H100]["changed"] == 0

    # Under if_needed check mode predicts the reboot without doing it.
    booted = _boot_time(host)
    predicted = converge([*disable, "--check"])
    assert predicted["stats"][H100]["changed"] > 0
    assert _mig_modes(host)[0] == ("Enabled", "Disabled")
    assert _boot_time(host) == booted

    rebooted = converge(disable)  # the host's own policy: if_needed
    outcome = stage_of(rebooted, H100, "mig_stage")
    assert outcome["status"] == "ready" and outcome["changed"], outcome
    assert set(_mig_modes(host)) == {("Disabled", "Disabled")}
    assert _boot_time(host) != booted

    back = converge(["--limit", H100])
    assert stage_of(back, H100, "mig_stage")["status"] == "ready"
    assert _mig_devices(host) == [BALANCED] * 8


def test_the_layout_comes_back_after_a_reboot(host):
    """A reboot loses the instances (as on real GPUs); upstream's service, with the
    stage's drop-ins, lays them out again at boot. Last in this file: it reboots."""
    subprocess.run(["podman", "restart", "-t", "5", "gpufleet-drv-h100"], check=True)
    for _ in range(90):
        if host.run("systemctl is-system-running").stdout.strip() in ("running", "degraded"):
            break
        time.sleep(1)
    assert _mig_devices(host) == [BALANCED] * 8


def _mig_devices(host) -> list[list[str]]:
    """Per GPU, the sorted profiles of its MIG devices as nvidia-smi -L lists them."""
    listed = smi.parse_list(host.check_output("nvidia-smi -L"))
    return [sorted(profiles) for profiles in listed.values()]


def _mig_modes(host) -> list[tuple[str, str]]:
    """Per GPU, its current and pending MIG mode."""
    out = host.check_output(
        "nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending --format=csv,noheader"
    )
    return [tuple(field.strip() for field in line.split(",")) for line in out.splitlines()]


def _boot_time(host) -> str:
    """When the node booted: its init's start (the container shares the host's boot id)."""
    return host.check_output("ps -o lstart= -p 1")


# The driver's package set moves as one: on this NVSwitch board that includes the
# fabric manager, which refuses to run beside a driver of another version. Run after
# the MIG tests, with the driver stage alone (the layout is the MIG tests' business).
DRIVER_ONLY = PROJECT / "playbooks" / "driver.yml"
FABRIC_MANAGER = "nvidia-fabricmanager-535"
CUDA_LIST = "/var/lib/apt/lists/_srv_gpufleet-repo_cuda_repos_debian12_x86%5f64_Packages"


def _task_results(run: dict, name: str, ending: str) -> list[dict]:
    return [
        task["hosts"][name]
        for play in run["plays"]
        for task in play["tasks"]
        if task["task"]["name"].endswith(ending) and name in task["hosts"]
    ]


def _loaded(host) -> str:
    out = host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    return out.splitlines()[0]


def test_a_downgrade_is_planned_as_one_and_moves_the_fabric_manager_with_the_driver(host):
    """From Debian's newest 535 build to 535.261.03, asked for by driver_version."""
    old = _loaded(host)
    assert old == "535.309.01" and version(host, FABRIC_MANAGER).startswith(old + "-")
    downgrade = ["--limit", H100, "-e", "driver_version=535.261.03"]
    plan = converge([*downgrade, "--check"], playbook=DRIVER_ONLY)
    said = _task_results(plan, H100, "Predict the replacement of the loaded driver")
    assert said[0]["msg"].endswith("with 535.261.03 (proprietary), a downgrade")
    checked = _task_results(
        plan, H100, "Check and fetch the whole driver package set before anything changes"
    )
    moves = {step["name"]: step for step in checked[0]["transaction"]}
    assert moves[FABRIC_MANAGER]["action"] == "downgrade"
    assert moves[FABRIC_MANAGER]["to"].startswith("535.261.03-")
    assert {moves[name]["action"] for name in HELD} == {"downgrade"}
    assert _loaded(host) == old  # the plan changed nothing

    applied = converge(downgrade, playbook=DRIVER_ONLY)
    outcome = stage_of(applied, H100)
    assert (outcome["status"], outcome["disruptive"]) == ("ready", True)
    assert _loaded(host) == "535.261.03"
    for name in (*HELD, FABRIC_MANAGER):
        assert version(host, name).startswith("535.261.03-"), name
    assert host.service("nvidia-fabricmanager").is_running
    assert FABRIC_MANAGER in held(host)
    assert host.file(READY).exists


def test_a_change_whose_fabric_manager_is_missing_is_refused_with_nothing_changed(host):
    """The repository index the node reads loses the fabric manager of 535.309.01 (an
    edited copy of apt's list stands for a mirror that never synced it): both the
    plan and the apply refuse the upgrade naming the package; the node keeps its
    driver, pin and fabric manager."""
    pin = host.file("/etc/apt/preferences.d/gpufleet-nvidia-driver.pref").content_string
    host.run_expect(
        [0],
        f"awk -v RS= -v ORS='\\n\\n' '!(/Package: {FABRIC_MANAGER}/ && /Version: 535.309.01-/)' "
        f"'{CUDA_LIST}' > /tmp/list && rm '{CUDA_LIST}' && mv /tmp/list '{CUDA_LIST}'",
    )
    try:
        upgrade = ["--limit", H100, "-e", "driver_version=535.309.01"]
        for mode in (["--check"], []):
            # (the stage playbook records the failure; site.yml fails the host at its end)
            run = converge([*upgrade, *mode], playbook=DRIVER_ONLY)
            outcome = stage_of(run, H100)
            assert outcome["status"] == "failed"
            assert outcome["reason"].startswith(
                "Check and fetch the whole driver package set before anything changes: "
                "not available from the node's package sources: "
                f"{FABRIC_MANAGER} 535.309.01 (they offer 535.261.03-1)"
            )
            assert _loaded(host) == "535.261.03"
            assert version(host, "nvidia-smi").startswith("535.261.03-")
            assert host.service("nvidia-fabricmanager").is_running
            assert (
                host.file("/etc/apt/preferences.d/gpufleet-nvidia-driver.pref").content_string
                == pin
            )
    finally:  # apt's own list back
        host.run_expect([0], f"rm -f '{CUDA_LIST}' && apt-get update -qq")


PIN = "/etc/apt/preferences.d/gpufleet-nvidia-driver.pref"
DKMS_HOOK = "/usr/lib/dkms/common.postinst"
# Fails the module build of one version as DKMS does, and hands the others to DKMS.
FAILING_HOOK = f"""#!/bin/sh
if [ "$2" = 535.309.01 ]; then
  echo "Error! Bad return status for module build on kernel: $(uname -r) (x86_64)"
  exit 10
fi
exec {DKMS_HOOK}.real "$@"
"""


def test_a_change_that_fails_after_the_old_packages_went_is_rolled_back(host):
    """DKMS fails to build 535.309.01's module (a wrapper around DKMS's own postinst
    hook, which Debian's nvidia-kernel-dkms calls with the module's version): dpkg
    leaves the new packages unconfigured after the old ones were replaced. The stage
    reinstalls the 535.261.03 set from apt's cache, puts the pin back, loads the old
    driver and starts its services; it reports the failure and the rollback."""
    pin = host.file(PIN).content_string
    host.run_expect([0], f"mv {DKMS_HOOK} {DKMS_HOOK}.real")
    host.run_expect(
        [0], f"printf %s {shlex.quote(FAILING_HOOK)} > {DKMS_HOOK} && chmod 755 {DKMS_HOOK}"
    )
    try:
        run = converge(["--limit", H100, "-e", "driver_version=535.309.01"], playbook=DRIVER_ONLY)
    finally:
        host.run_expect([0], f"mv {DKMS_HOOK}.real {DKMS_HOOK}")
    outcome = stage_of(run, H100)
    assert outcome["status"] == "failed"
    reason = outcome["reason"]
    assert reason.startswith(
        "Install the driver packages, with the fabric manager on NVSwitch systems: "
        "apt-get install failed: Error! Bad return status for module build on kernel: "
    )
    assert "; dpkg: error processing package nvidia-kernel-dkms (--configure):" in reason
    assert reason.endswith("; rolled back to 535.261.03")
    assert _loaded(host) == "535.261.03"
    for name in (*HELD, FABRIC_MANAGER):
        assert version(host, name).startswith("535.261.03-"), name
    assert host.run("dpkg --audit").stdout == ""  # nothing left half-installed
    assert {*HELD, FABRIC_MANAGER} <= held(host)
    assert host.file(PIN).content_string == pin
    for unit in ("nvidia-persistenced", "nvidia-fabricmanager"):
        assert host.service(unit).is_running
    assert host.file(READY).exists
    # The node is as it was: the old version's settings change nothing.
    again = converge(["--limit", H100, "-e", "driver_version=535.261.03"], playbook=DRIVER_ONLY)
    assert again["stats"][H100]["changed"] == 0


def test_a_node_left_between_two_drivers_is_finished_by_the_next_run(host):
    """The same failure with driver_rollback off leaves nvidia-kernel-dkms
    half-configured at 535.309.01 under the loaded 535.261.03 (what a killed run
    leaves too). That is still the packages' driver, not one installed some other
    way: once the cause is gone, the next run finishes the change (an upgrade, the
    fabric manager moving with the driver)."""
    host.run_expect([0], f"mv {DKMS_HOOK} {DKMS_HOOK}.real")
    host.run_expect(
        [0], f"printf %s {shlex.quote(FAILING_HOOK)} > {DKMS_HOOK} && chmod 755 {DKMS_HOOK}"
    )
    change = ["--limit", H100, "-e", "driver_version=535.309.01"]
    try:
        run = converge([*change, "-e", '{"driver_rollback": false}'], playbook=DRIVER_ONLY)
    finally:
        host.run_expect([0], f"mv {DKMS_HOOK}.real {DKMS_HOOK}")
    outcome = stage_of(run, H100)
    assert outcome["status"] == "failed" and "rolled back" not in outcome["reason"]
    assert "nvidia-kernel-dkms" in host.run("dpkg --audit").stdout
    planned = converge([*change, "--check"], playbook=DRIVER_ONLY)
    checked = _task_results(
        planned, H100, "Check and fetch the whole driver package set before anything changes"
    )
    steps = {(step["name"], step["action"]) for step in checked[0]["transaction"]}
    assert ("nvidia-kernel-dkms", "configure") in steps

    finished = converge(change, playbook=DRIVER_ONLY)
    assert stage_of(finished, H100)["status"] == "ready"
    assert host.run("dpkg --audit").stdout == ""
    assert _loaded(host) == "535.309.01"
    for name in (*HELD, FABRIC_MANAGER):
        assert version(host, name).startswith("535.309.01-"), name
    assert {*HELD, FABRIC_MANAGER} <= held(host)
    assert host.service("nvidia-fabricmanager").is_running


# dpkg leaves out what matches a path-exclude (as minimal images do with firmware).
NO_FIRMWARE = "/etc/dpkg/dpkg.cfg.d/zz-test-no-gsp-firmware"


def test_a_new_driver_that_does_not_start_the_gpus_is_rolled_back(host):
    """535.261.03's GSP firmware left out by a dpkg path-exclude: the downgrade
    installs, its module loads and its services start, but no Hopper GPU starts
    without the firmware (the kernel log says RmInitAdapter failed) and nvidia-smi
    answers for none. The stage takes the loaded module out and puts 535.309.01 back."""
    assert _loaded(host) == "535.309.01"
    pin = host.file(PIN).content_string
    host.run_expect([0], f"echo 'path-exclude=*/firmware/nvidia/535.261.03/*' > {NO_FIRMWARE}")
    try:
        run = converge(["--limit", H100, "-e", "driver_version=535.261.03"], playbook=DRIVER_ONLY)
    finally:
        host.run_expect([0], f"rm -f {NO_FIRMWARE}")
    outcome = stage_of(run, H100)
    assert outcome["status"] == "failed"
    assert outcome["reason"].startswith("Check that the new driver answers for every GPU: ")
    assert outcome["reason"].endswith("; rolled back to 535.309.01")
    kernel_log = host.check_output("cat /dev/kmsg")
    assert "NVRM: GPU 0000:18:00.0: RmInitAdapter failed!" in kernel_log
    assert _loaded(host) == "535.309.01"
    uuids = host.check_output("nvidia-smi --query-gpu=uuid --format=csv,noheader")
    assert len(uuids.splitlines()) == 8
    for name in (*HELD, FABRIC_MANAGER):
        assert version(host, name).startswith("535.309.01-"), name
    assert {*HELD, FABRIC_MANAGER} <= held(host)
    assert host.file(PIN).content_string == pin
    for unit in ("nvidia-persistenced", "nvidia-fabricmanager"):
        assert host.service(unit).is_running
    assert host.file(READY).exists
