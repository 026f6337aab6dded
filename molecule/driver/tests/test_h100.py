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
