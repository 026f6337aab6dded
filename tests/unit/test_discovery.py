# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_facts' pure logic: driver state, PCI scanning, GFD labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import cpus, discovery, pci, smi
from conftest import FIXTURES


def _device(
    root: Path,
    address: str,
    vendor: str,
    device: str,
    pci_class: str,
    numa: str = "0",
    driver: str | None = None,
) -> None:
    path = root / "bus" / "pci" / "devices" / address
    path.mkdir(parents=True)
    for name, value in (
        ("vendor", vendor),
        ("device", device),
        ("class", pci_class),
        ("numa_node", numa),
    ):
        (path / name).write_text(value + "\n")
    if driver:
        target = root / "bus" / "pci" / "drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        (path / "driver").symlink_to(target)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    _device(tmp_path, "0000:02:00.0", "0x1a03", "0x2000", "0x030000")  # BMC VGA
    _device(tmp_path, "0000:18:00.0", "0x10de", "0x2330", "0x030200", "0", "nvidia")
    _device(tmp_path, "0000:9a:00.0", "0x10de", "0x2330", "0x030200", "1", "nvidia")
    _device(tmp_path, "0000:05:00.0", "0x10de", "0x22a3", "0x068000")
    _device(tmp_path, "0000:4b:00.0", "0x15b3", "0x101b", "0x020700")
    return tmp_path


def test_scan_finds_nvidia_gpus_and_nvswitches_only(sysfs):
    devices = pci.scan(str(sysfs))
    gpus = pci.nvidia_gpus(devices)
    assert [g.address for g in gpus] == ["0000:18:00.0", "0000:9a:00.0"]
    assert [g.numa_node for g in gpus] == [0, 1]
    assert all(g.driver == "nvidia" for g in gpus)
    assert [s.address for s in pci.nvswitches(devices)] == ["0000:05:00.0"]


def test_scan_of_a_missing_tree_is_empty(tmp_path):
    assert pci.scan(str(tmp_path / "nothing")) == []


def test_gpu_names_come_from_the_id_table_before_the_driver_loads(sysfs):
    gpus = discovery.gpu_list(pci.nvidia_gpus(pci.scan(str(sysfs))), None, None)
    assert gpus[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert gpus[0]["name_source"] == "pci-id-table"
    assert gpus[0]["family"] == "hopper"
    assert gpus[0]["uuid"] is None


def test_labels_of_a_loaded_h100_node(sysfs):
    rows = smi.parse_query_csv((FIXTURES / "nvidia-smi" / "h100-sxm-8.csv").read_text())
    gpus = discovery.gpu_list(pci.nvidia_gpus(pci.scan(str(sysfs))), rows, None)
    driver = discovery.driver_facts("550.127.05", "OE", None)
    labels = discovery.labels(gpus, driver, "12.4")
    assert labels == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/cuda.driver-version.full": "550.127.05",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "127",
        "nvidia.com/cuda.driver-version.revision": "05",
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4",
    }


def test_a_node_without_gpus_is_labelled_not_present():
    assert discovery.labels([], discovery.driver_facts(None, None, None), None) == {
        "nvidia.com/gpu.present": "false"
    }


def test_an_open_module_installed_under_a_loaded_proprietary_one_is_visible():
    facts = discovery.driver_facts(
        "535.261.03",
        "POE",
        {
            "version": "535.261.03",
            "module_type": "open",
            "installed_by": "package",
            "package": "nvidia-open-kernel-dkms",
        },
    )
    assert (facts["module_type"], facts["installed_module_type"]) == ("proprietary", "open")


@pytest.mark.parametrize(
    ("loaded", "taint", "installed", "state", "module_type", "installed_by"),
    [
        (None, None, None, "absent", None, None),
        (
            None,
            None,
            {
                "version": "535.261.03",
                "module_type": "open",
                "installed_by": "package",
                "package": "nvidia-open-kernel-dkms",
            },
            "installed",
            "open",
            "package",
        ),
        (
            "535.261.03",
            "POE",
            {
                "version": "535.261.03",
                "module_type": "proprietary",
                "installed_by": "package",
                "package": "nvidia-kernel-dkms",
            },
            "loaded",
            "proprietary",
            "package",
        ),
        ("550.127.05", "OE", None, "loaded", "open", "other"),
    ],
)
def test_driver_state(loaded, taint, installed, state, module_type, installed_by):
    facts = discovery.driver_facts(loaded, taint, installed)
    assert (facts["state"], facts["module_type"], facts["installed_by"]) == (
        state,
        module_type,
        installed_by,
    )


def test_installed_driver_from_dpkg_query_output():
    output = "un |nvidia-open-kernel-dkms|\nii |nvidia-kernel-dkms|535.261.03-1~deb12u1\n"
    assert discovery.installed_from_dpkg(output) == {
        "version": "535.261.03",
        "module_type": "proprietary",
        "installed_by": "package",
        "package": "nvidia-kernel-dkms",
        "package_state": "installed",
    }
    assert discovery.installed_from_dpkg("un |nvidia-kernel-dkms|\n") is None
    held = discovery.installed_from_dpkg("hi |nvidia-open-kernel-dkms|535.261.03-1\n")
    assert held["version"] == "535.261.03" and held["module_type"] == "open"
    assert discovery.installed_from_dpkg("rc |nvidia-kernel-dkms|535.261.03-1\n") is None


def test_a_module_package_a_failed_run_left_half_done_is_still_the_packages():
    """Not a driver installed some other way: the driver stage finishes it."""
    half = discovery.installed_from_dpkg("hF |nvidia-kernel-dkms|535.309.01-0+deb12u1\n")
    assert (half["installed_by"], half["version"]) == ("package", "535.309.01")
    assert half["package_state"] == "half-configured"
    unpacked = discovery.installed_from_dpkg("iU |nvidia-open-kernel-dkms|535.261.03-1\n")
    assert unpacked["package_state"] == "unpacked"


def test_installed_driver_from_rpm_query_output():
    assert (
        discovery.installed_from_rpm("kmod-nvidia-open-dkms|570.86.15\n")["module_type"] == "open"
    )
    assert discovery.installed_from_rpm("package kmod-nvidia* is not installed\n") is None


@pytest.mark.parametrize(
    ("efivar", "efi", "state"),
    [
        (b"\x06\x00\x00\x00\x01", True, "enabled"),
        (b"\x06\x00\x00\x00\x00", True, "disabled"),
        (None, True, "disabled"),
        (None, False, "unsupported"),
    ],
)
def test_secure_boot_state(efivar, efi, state):
    assert discovery.secure_boot_state(efivar, efi) == state


def test_label_values_are_valid_kubernetes_label_values():
    assert discovery.label_value("NVIDIA A100 80GB PCIe") == "NVIDIA-A100-80GB-PCIe"
    assert discovery.label_value("Tesla V100-SXM2-16GB (rev a1)") == "Tesla-V100-SXM2-16GB-rev-a1"


def _cpu(root: Path, cpu: int, package: int, siblings: str) -> None:
    topology = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
    topology.mkdir(parents=True)
    (topology / "physical_package_id").write_text(f"{package}\n")
    (topology / "core_cpus_list").write_text(f"{siblings}\n")


def test_cores_are_numbered_package_by_package_whatever_the_cpu_ids(tmp_path):
    # Two packages of two cores with two threads each, CPU ids interleaving packages
    # as many two-socket servers number them: cpu0, cpu2 on package 0, cpu1, cpu3 on 1,
    # their hyperthreads 4-7.
    for cpu, package, siblings in [
        (0, 0, "0,4"),
        (1, 1, "1,5"),
        (2, 0, "2,6"),
        (3, 1, "3,7"),
        (4, 0, "0,4"),
        (5, 1, "1,5"),
        (6, 0, "2,6"),
        (7, 1, "3,7"),
    ]:
        _cpu(tmp_path, cpu, package, siblings)
    (tmp_path / "devices" / "system" / "cpu" / "online").write_text("0-7\n")
    assert cpus.core_indexes(str(tmp_path)) == {0: 0, 4: 0, 2: 1, 6: 1, 1: 2, 5: 2, 3: 3, 7: 3}
    assert cpus.core_indexes(str(tmp_path / "nothing")) == {}
    # A core whose CPUs are offline is not counted.
    (tmp_path / "devices" / "system" / "cpu" / "online").write_text("0-2,4-6\n")
    assert cpus.core_indexes(str(tmp_path)) == {0: 0, 4: 0, 2: 1, 6: 1, 1: 2, 5: 2}


@pytest.mark.parametrize(
    ("text", "ids"),
    [("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]), ("5", [5]), ("", []), ("0-x", [])],
)
def test_kernel_cpulists(text, ids):
    assert cpus.parse_cpulist(text) == ids


def test_each_gpu_knows_the_cores_near_it(sysfs):
    for address, cpulist in (("0000:18:00.0", "0-1,4-5"), ("0000:9a:00.0", "2-3,6-7")):
        (sysfs / "bus" / "pci" / "devices" / address / "local_cpulist").write_text(cpulist)
    for cpu in range(8):
        _cpu(sysfs, cpu, cpu % 4 // 2, f"{cpu % 4},{cpu % 4 + 4}")
    gpus = discovery.gpu_list(
        pci.nvidia_gpus(pci.scan(str(sysfs))), None, None, cpus.core_indexes(str(sysfs))
    )
    assert [g["local_cores"] for g in gpus] == [[0, 1], [2, 3]]
    # Without local_cpulist (an older kernel, a VM's flat topology) nothing is claimed.
    assert (
        discovery.gpu_list(pci.nvidia_gpus(pci.scan(str(sysfs))), None, None)[0]["local_cores"]
        == []
    )


MIG_MINORS = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n" + (
    "gpu3/gi1/access 39\ngpu3/gi1/ci0/access 40\ngpu3/gi2/access 48\ngpu3/gi2/ci0/access 49\n"
)


def test_mig_devices_get_their_capability_files_by_the_gpus_minor_number():
    # GPU index 0 is /dev/nvidia3: the driver's list is keyed by minor number.
    gpus = [
        {
            "minor_number": 3,
            "mig_devices": [
                {"index": 0, "gpu_instance_id": 1, "compute_instance_id": 0},
                {"index": 1, "gpu_instance_id": 2, "compute_instance_id": 0},
                {"index": 2, "gpu_instance_id": 5, "compute_instance_id": 0},
            ],
        }
    ]
    discovery.mig_cap_files(gpus, MIG_MINORS)
    assert [d["cap_files"] for d in gpus[0]["mig_devices"]] == [
        ["/dev/nvidia-caps/nvidia-cap39", "/dev/nvidia-caps/nvidia-cap40"],
        ["/dev/nvidia-caps/nvidia-cap48", "/dev/nvidia-caps/nvidia-cap49"],
        [],  # an instance the list does not name
    ]
    # A device file not made yet: a job given the device could not open it.
    discovery.mig_cap_files(gpus, MIG_MINORS, lambda path: not path.endswith("cap49"))
    assert [bool(d["cap_files"]) for d in gpus[0]["mig_devices"]] == [True, False, False]


PCI_IDS = """# pci.ids, as pciutils and hwdata ship it (an excerpt, names made up)
10de  NVIDIA Corporation
\t2330  GH100 [H100 SXM5 80GB]
\t2bb5  GB202GL [Example Blackwell Board]
\t\t10de 204e  Example subsystem
15b3  Mellanox Technologies
\t2bb5  Not an NVIDIA device
"""


def test_a_gpu_not_in_the_table_is_named_from_the_nodes_pci_ids(tmp_path):
    _device(tmp_path, "0000:3b:00.0", "0x10de", "0x2bb5", "0x030200", "0")
    names = pci.pci_ids_names(PCI_IDS)
    assert names == {0x2330: "GH100 [H100 SXM5 80GB]", 0x2BB5: "GB202GL [Example Blackwell Board]"}
    (gpu,) = discovery.gpu_list(pci.nvidia_gpus(pci.scan(str(tmp_path))), None, None, None, names)
    assert (gpu["name"], gpu["name_source"]) == ("GB202GL [Example Blackwell Board]", "pci.ids")
    assert (gpu["compute_major"], gpu["family"]) == (None, None), "a name, not a generation"
    (bare,) = discovery.gpu_list(pci.nvidia_gpus(pci.scan(str(tmp_path))), None, None)
    assert (bare["name"], bare["name_source"]) == (None, None)
