# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Find NVIDIA GPUs and NVSwitches in a sysfs tree.

Reads <sysfs_root>/bus/pci/devices/*/{vendor,device,class,numa_node,local_cpulist,
driver}, the same files lspci and node-feature-discovery read. `sysfs_root` is /sys on a host;
another root lets the same code read a host sysfs mounted elsewhere.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from ansible_collections.gpufleet.nvidia.plugins.module_utils.cpus import parse_cpulist
from ansible_collections.gpufleet.nvidia.plugins.module_utils.cpus import read_sysfs as _read

NVIDIA_VENDOR = 0x10DE
# PCI base class 0x03 (display): subclass 0x00 VGA-compatible, 0x02 3D controller.
GPU_CLASSES = (0x0300, 0x0302)
# NVSwitch chips enumerate as "bridge, other" (class 0x0680).
NVSWITCH_CLASS = 0x0680


@dataclass(frozen=True)
class PciDevice:
    address: str
    vendor: int
    device: int
    class_code: int  # the 24-bit class register
    numa_node: int
    driver: str | None
    # The CPUs the kernel counts as close to the device (its NUMA node's); () unknown.
    local_cpus: tuple[int, ...] = field(default=())

    @property
    def base_class(self) -> int:
        return self.class_code >> 8

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["vendor"] = f"0x{self.vendor:04x}"
        data["device"] = f"0x{self.device:04x}"
        data["class_code"] = f"0x{self.class_code:06x}"
        data["local_cpus"] = list(self.local_cpus)
        return data


def _hex(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value, 16)
    except ValueError:
        return None


def scan(sysfs_root: str) -> list[PciDevice]:
    """Every PCI device under `sysfs_root`, sorted by address."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        addresses = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    devices = []
    for address in addresses:
        path = os.path.join(base, address)
        vendor = _hex(_read(os.path.join(path, "vendor")))
        device = _hex(_read(os.path.join(path, "device")))
        class_code = _hex(_read(os.path.join(path, "class")))
        if vendor is None or device is None or class_code is None:
            continue
        numa_text = _read(os.path.join(path, "numa_node"))
        try:
            numa_node = int(numa_text) if numa_text is not None else -1
        except ValueError:
            numa_node = -1
        driver_link = os.path.join(path, "driver")
        driver = os.path.basename(os.readlink(driver_link)) if os.path.islink(driver_link) else None
        local_cpus = tuple(parse_cpulist(_read(os.path.join(path, "local_cpulist"))))
        devices.append(
            PciDevice(address, vendor, device, class_code, numa_node, driver, local_cpus)
        )
    return devices


def nvidia_gpus(devices: list[PciDevice]) -> list[PciDevice]:
    return [d for d in devices if d.vendor == NVIDIA_VENDOR and d.base_class in GPU_CLASSES]


def nvswitches(devices: list[PciDevice]) -> list[PciDevice]:
    return [d for d in devices if d.vendor == NVIDIA_VENDOR and d.base_class == NVSWITCH_CLASS]


# Where pciutils (Debian, Ubuntu) and hwdata (RHEL family) keep the PCI ID repository's
# list of device names.
PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids")


def pci_ids_names(text: str, vendor: int = NVIDIA_VENDOR) -> dict[int, str]:
    """Device id -> name of one vendor's devices, from a pci.ids file's text (a vendor
    line at the margin, its devices one tab in, their subsystems two tabs in)."""
    names: dict[int, str] = {}
    inside = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            inside = line[:4].lower() == f"{vendor:04x}"
            continue
        if inside and not line.startswith("\t\t"):
            device, _, name = line[1:].partition("  ")
            device_id = _hex(device.strip())
            if device_id is not None and name.strip():
                names[device_id] = name.strip()
    return names
