"""HGX H100 node, driver_reboot_policy: if_needed, newest 535 build."""

from __future__ import annotations

import subprocess
import time

from helpers import BLACKLIST, HELD, READY, held, version

testinfra_hosts = ["podman://gpufleet-drv-h100"]


def test_debian_packages_are_installed_and_held(host):
    assert set(HELD) <= held(host)
    assert host.file(BLACKLIST).contains("^blacklist nouveau")
    assert not host.file("/etc/apt/preferences.d/gpufleet-nvidia-driver.pref").exists


def test_node_was_rebooted_into_a_validated_driver(host):
    assert len(host.check_output("nvidia-smi -L").splitlines()) == 8
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
    assert [
        line.split("(UUID: ")[1].rstrip(")")
        for line in host.check_output("nvidia-smi -L").splitlines()
    ] == uuids
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


def test_nvidias_mig_manager_lays_the_gpus_out_again_at_every_boot(host):
    """NVIDIA's nvidia-mig-manager package (mig-parted, its systemd service, hooks and
    default config; from the local copy of the CUDA repository) on the simulated H100s.

    The layout its service applies is what nvidia-smi and nvidia-ctk see; a reboot loses
    the instances (as on real GPUs) and the service lays them out again at boot. Last
    in this file: it reboots the node.
    """
    deb = host.check_output("ls /srv/gpufleet-repo/cuda/repos/debian12/x86_64/nvidia-mig-manager_*")
    host.check_output(f"apt-get install -y -q {deb}")
    assert host.service("nvidia-mig-manager").is_enabled  # as upstream's package does
    assert "v0.10.0" in host.check_output("nvidia-mig-parted --version")
    current = host.check_output("nvidia-mig-parted export")
    assert "mig-enabled: false" in current

    # Idle GPUs change MIG mode at once; the daemons holding them are stopped meanwhile
    # (upstream's hooks for Hopper stop nothing, and a GPU reset is not simulated).
    host.check_output("systemctl stop nvidia-fabricmanager nvidia-persistenced")
    host.check_output(
        "sed -i 's/all-disabled/all-1g.10gb/' "
        "/etc/systemd/system/nvidia-mig-manager.service.d/override.conf"
        " && systemctl daemon-reload && systemctl start nvidia-mig-manager"
    )
    host.check_output("systemctl start nvidia-persistenced nvidia-fabricmanager")
    assert _mig_devices(host) == ["1g.10gb"] * 56
    assert host.check_output(
        "nvidia-mig-parted assert -f /etc/nvidia-mig-manager/config.yaml -c all-1g.10gb"
    ).endswith("currently applied")
    # Each instance's capability device files (a GPU and a compute instance each).
    assert len(host.check_output("ls /dev/nvidia-caps").split()) == 2 + 2 * 56

    subprocess.run(["podman", "restart", "-t", "5", "gpufleet-drv-h100"], check=True)
    for _ in range(90):
        if host.run("systemctl is-system-running").stdout.strip() in ("running", "degraded"):
            break
        time.sleep(1)
    assert host.service("nvidia-mig-manager").is_enabled
    assert _mig_devices(host) == ["1g.10gb"] * 56


def _mig_devices(host) -> list[str]:
    listed = host.check_output("nvidia-smi -L").splitlines()
    return [line.split()[1] for line in listed if line.strip().startswith("MIG ")]
