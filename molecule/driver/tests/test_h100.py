"""HGX H100 node, driver_reboot_policy: if_needed, newest 535 build."""

from __future__ import annotations

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
