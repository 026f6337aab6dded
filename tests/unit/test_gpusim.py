# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The simulation kit: profiles, the simulated sysfs, modules and their device files.

What NVML and nvidia-smi make of a simulated node is in test_mock_nvml.py.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import cpus, discovery, pci
from conftest import PROFILE_DIR
from gpusim import node, profiles

REQUIRED_PROFILES = {"h100-sxm-8", "a100-pcie-2", "t4-1", "a100-mig", "none"}


def test_every_required_profile_exists_and_loads():
    assert set(profiles.available(PROFILE_DIR)) >= REQUIRED_PROFILES
    for name in profiles.available(PROFILE_DIR):
        profiles.load(PROFILE_DIR, name, "node-a")


def test_h100_profile_is_an_hgx_board():
    prof = profiles.load(PROFILE_DIR, "h100-sxm-8", "node-a")
    assert len(prof.gpus) == 8 and len(prof.nvswitches) == 4
    assert {g.device_id for g in prof.gpus} == {0x2330}
    assert {s.device_id for s in prof.nvswitches} == {0x22A3}
    assert {g.numa_node for g in prof.gpus} == {0, 1}


def test_identities_are_stable_per_node_and_distinct_across_nodes():
    a1 = profiles.load(PROFILE_DIR, "t4-1", "node-a").gpus[0]
    a2 = profiles.load(PROFILE_DIR, "t4-1", "node-a").gpus[0]
    b = profiles.load(PROFILE_DIR, "t4-1", "node-b").gpus[0]
    assert a1.uuid == a2.uuid and a1.serial == a2.serial
    assert a1.uuid != b.uuid


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(profiles.ProfileError, match=r"unknown GPU profile 'h200'.*t4-1"):
        profiles.load(PROFILE_DIR, "h200", "node-a")


def test_boot_lays_out_a_pci_tree_that_gpu_facts_reads(sim_node):
    sim_node("h100-sxm-8")
    devices = pci.scan(str(node.SYS))
    assert len(pci.nvidia_gpus(devices)) == 8
    assert len(pci.nvswitches(devices)) == 4
    # A fresh node with GPUs and no blacklist: nouveau has claimed them.
    assert node.loaded("nouveau")
    assert {d.driver for d in pci.nvidia_gpus(devices)} == {"nouveau"}


def test_the_machines_cpus_are_dealt_to_the_profiles_numa_nodes(sim_node, monkeypatch):
    host = sim_node.tmp / "host-cpu"
    for cpu in range(4):
        (host / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (host / f"cpu{cpu}" / "topology" / "physical_package_id").write_text("0\n")
        (host / f"cpu{cpu}" / "topology" / "core_cpus_list").write_text(f"{cpu}\n")
    (host / "online").write_text("0-3\n")
    monkeypatch.setattr(node, "HOST_CPUS", host)
    sim_node("h100-sxm-8")  # GPUs 0-3 on NUMA node 0, 4-7 on node 1
    cores = cpus.core_indexes(str(node.SYS))
    gpus = discovery.gpu_list(pci.nvidia_gpus(pci.scan(str(node.SYS))), None, None, cores)
    assert [g["local_cores"] for g in gpus] == [[0, 1]] * 4 + [[2, 3]] * 4
    # Cores are dealt whole, hyperthreads with them; more NUMA nodes than cores: each
    # node still has one.
    assert node.numa_cpus([0, 1], [[0, 2], [1, 3]]) == {0: "0,2", 1: "1,3"}
    assert node.numa_cpus([0, 1, 2], [[0], [1]]) == {0: "0", 1: "1", 2: "0"}


def test_no_driver_package_means_module_not_found(sim_node):
    sim_node("t4-1")
    with pytest.raises(node.ModuleError, match="Module nvidia not found"):
        node.load_module("nvidia")


def test_nouveau_keeps_the_nvidia_module_from_binding(sim_node):
    sim_node("t4-1", node.InstalledDriver("535.261.03", "proprietary", "package:x"))
    with pytest.raises(node.ModuleError, match="No such device"):
        node.load_module("nvidia")


def test_preinstalled_driver_loads_at_boot_and_is_held_by_persistence(sim_node):
    sim_node("l4-1-preinstalled")
    assert node.loaded_driver() == {"version": "550.127.05", "module_type": "open"}
    taint = (node.SYS / "module" / "nvidia" / "taint").read_text().strip()
    assert discovery.module_type_from_taint(taint) == "open"
    assert (sim_node.tmp / "bin" / "nvidia-smi").is_symlink()
    (node.RUN / "persistence-mode").touch()
    with pytest.raises(node.ModuleError, match="in use"):
        node.unload_module("nvidia")
    (node.RUN / "persistence-mode").unlink()
    node.unload_module("nvidia")
    assert node.loaded_driver() is None


def test_drift_helper_changes_the_loaded_version(sim_node):
    sim_node("l4-1-preinstalled")
    node.set_loaded_version("550.54.15")
    assert node.loaded_driver()["version"] == "550.54.15"
    assert (node.SYS / "module" / "nvidia" / "version").read_text().strip() == "550.54.15"


def test_secure_boot_rejects_an_unsigned_module(sim_node, monkeypatch):
    original = profiles.load

    def with_secure_boot(*args):
        prof = original(*args)
        return profiles.Profile(**{**prof.__dict__, "secure_boot": True})

    monkeypatch.setattr(profiles, "load", with_secure_boot)
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: True)
    sim_node("t4-1", node.InstalledDriver("535.261.03", "proprietary", "package:x"))
    assert not node.loaded("nvidia")
    with pytest.raises(node.ModuleError, match="Key was rejected by service"):
        node.load_module("nvidia")


def test_gpus_whose_gsp_firmware_is_missing_do_not_start(sim_node, monkeypatch):
    """Without /lib/firmware/nvidia/<version>/gsp_*.bin (Debian's firmware-nvidia-gsp),
    the module loads, but a Hopper GPU (any GPU under the open module) does not start:
    the kernel log says why and nothing answers behind it."""
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: True)
    sim_node("h100-sxm-8", node.InstalledDriver("535.309.01", "proprietary", "package:x"), False)
    node.load_module("nvidia")
    assert node.loaded_driver()["version"] == "535.309.01"
    assert not any(node.DEV.glob("nvidia[0-9]*")) and (node.DEV / "nvidiactl").exists()
    log = (node.DEV / "kmsg").read_text()
    assert "NVRM: GPU 0000:18:00.0: RmInitAdapter failed!" in log
    assert log.count("RmFetchGspRmImages: No firmware image found") == 8
    # Its version's firmware in place, the same module starts every GPU.
    node.unload_module("nvidia")
    (node.FIRMWARE / "535.309.01").mkdir(parents=True)
    (node.FIRMWARE / "535.309.01" / "gsp_ga10x.bin").write_bytes(b"")
    node.load_module("nvidia")
    assert len(list(node.DEV.glob("nvidia[0-9]*"))) == 8


def test_a_turing_gpu_runs_without_gsp_under_the_proprietary_module_only(sim_node, monkeypatch):
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: True)
    sim_node("t4-1", node.InstalledDriver("535.261.03", "proprietary", "package:x"), False)
    node.load_module("nvidia")
    assert (node.DEV / "nvidia0").exists()
    node.unload_module("nvidia")
    sim_node("t4-1", node.InstalledDriver("535.261.03", "open", "package:x"), False)
    node.load_module("nvidia")
    assert not (node.DEV / "nvidia0").exists()


def test_kit_refuses_to_run_on_a_host_without_the_marker(tmp_path, monkeypatch):
    monkeypatch.setattr(node, "MARKER", tmp_path / "absent")
    with pytest.raises(node.NotASimulatedNode, match="refusing to run"):
        node.require_simulated_node()


def test_device_files_appear_and_vanish_with_their_modules(sim_node, monkeypatch):
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: True)
    sim_node("a100-mig", node.InstalledDriver("535.261.03", "proprietary", "package:x"))
    dev = node.DEV
    assert sorted(p.name for p in dev.iterdir() if p.is_char_device()) == [
        "nvidia0",
        "nvidia1",
        "nvidiactl",
    ]
    # MIG's config and monitor capabilities, and the access capabilities of the
    # profile's instances (GPU 0: GIs 1-2, GPU 1: GIs 1-7, each with CI 0), numbered
    # as the driver lists them in /proc/driver/nvidia-caps/mig-minors.
    minors = (node.PROC_DRIVER / "nvidia-caps" / "mig-minors").read_text().splitlines()
    assert minors[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu1/gi1/ci0/access 148" in minors
    instance_caps = {12, 13, 21, 22} | {
        m for gi in range(1, 8) for m in (138 + 9 * gi, 139 + 9 * gi)
    }
    assert {p.name for p in (dev / "nvidia-caps").iterdir()} == {
        f"nvidia-cap{minor}" for minor in {1, 2} | instance_caps
    }
    node.load_module("nvidia-uvm")
    assert (dev / "nvidia-uvm").is_char_device() and (dev / "nvidia-uvm-tools").exists()
    # The kernel refuses to unload a module another one uses: dependants go first.
    with pytest.raises(node.ModuleError, match="Module nvidia is in use"):
        node.unload_module("nvidia")
    node.unload_module("nvidia_uvm")
    node.unload_module("nvidia")
    # Left: the kernel's log (the simulated kernel keeps /dev/kmsg as a file).
    assert [path.name for path in dev.iterdir()] == ["kmsg"]
    assert not (node.PROC_DRIVER / "nvidia-caps").exists()


def test_a_process_holding_a_gpu_keeps_the_module_loaded(sim_node, monkeypatch):
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: True)
    sim_node("t4-1", node.InstalledDriver("535.261.03", "proprietary", "package:x"))
    with (
        (node.DEV / "nvidia0").open("rb"),
        pytest.raises(node.ModuleError, match="Module nvidia is in use"),
    ):
        node.unload_module("nvidia")
    node.unload_module("nvidia")
    assert not node.loaded("nvidia")


def test_the_versioned_nvml_file_holds_the_mock_while_the_package_is_installed(
    sim_node, tmp_path, monkeypatch
):
    """What nvidia-ctk mounts into containers is libnvidia-ml.so.<version>, not the
    .so.1 link: it must be the mock too, and the package's own file is kept aside."""
    kit = tmp_path / "kit"
    (kit / "lib").mkdir(parents=True)
    (kit / "lib" / "libnvidia-ml.so.1").write_bytes(b"mock NVML")
    monkeypatch.setattr(node, "HOME", kit)
    sim_node("t4-1")
    lib = tmp_path / "lib"
    versioned = lib / "libnvidia-ml.so.535.261.03"
    lib.mkdir(exist_ok=True)
    # What dpkg leaves with the image's diversion: the package's .so.1 link moved aside.
    versioned.write_bytes(b"NVIDIA's NVML")
    (lib / "libnvidia-ml.so.1.gpusim-real").symlink_to(versioned.name)

    node.link_driver_binaries()
    assert versioned.read_bytes() == b"mock NVML"
    assert (lib / "libnvidia-ml.so.535.261.03.gpusim-real").read_bytes() == b"NVIDIA's NVML"
    assert os.readlink(lib / "libnvidia-ml.so.1") == str(kit / "lib" / "libnvidia-ml.so.1")
    node.link_driver_binaries()  # a second dpkg run changes nothing
    assert (lib / "libnvidia-ml.so.535.261.03.gpusim-real").read_bytes() == b"NVIDIA's NVML"

    # The package removed: its file, and with it the kept real one, are gone.
    versioned.unlink()
    (lib / "libnvidia-ml.so.1.gpusim-real").unlink()
    node.link_driver_binaries()
    assert sorted(p.name for p in lib.iterdir()) == []


def test_a_node_with_the_hosts_own_kmsg_is_never_written_or_read(sim_node):
    """A privileged node (molecule runtime) has the host's /dev/kmsg, a device: the
    simulated kernel leaves it alone (a write would land in the host's log; a read of
    the real one waits for the next record). A FIFO stands in for it here."""
    import os
    import signal

    from gpusim import faults

    prof = sim_node("t4-1")
    log = node.DEV / "kmsg"
    log.unlink()
    os.mkfifo(log)

    def hung(_signum, _frame):
        raise AssertionError("the simulated kernel opened the host's log")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        faults.log_kernel("NVRM: loading")
        faults.inject(prof, "ecc-dbe", 0)
        faults.at_boot(prof)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not log.is_file() and log.exists()
