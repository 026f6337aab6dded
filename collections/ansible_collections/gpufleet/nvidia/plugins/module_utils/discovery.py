# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Assemble a node's GPU facts and its GFD-style labels from what was read.

Pure functions: the module reads sysfs, package databases and nvidia-smi, and hands
the results here; tests call these directly.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_models
from ansible_collections.gpufleet.nvidia.plugins.module_utils.pci import PciDevice

LABEL_PREFIX = "nvidia.com/"
# EFI global-variable GUID under which firmware publishes the SecureBoot variable.
EFI_GLOBAL_GUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"


def module_type_from_taint(taint: str) -> str:
    """The proprietary nvidia.ko taints the kernel with 'P'; the open one does not."""
    return "proprietary" if "P" in taint else "open"


def secure_boot_state(efivar: bytes | None, efi_present: bool) -> str:
    """`enabled`, `disabled`, or `unsupported` (legacy BIOS boot, no EFI)."""
    if not efi_present:
        return "unsupported"
    if efivar is None or len(efivar) < 5:
        return "disabled"
    return "enabled" if efivar[4] == 1 else "disabled"


def installed_driver(run, which):
    """The driver a package manager installed ({version, module_type, installed_by,
    package}, from dpkg-query or rpm), else the one modinfo finds for the running
    kernel (installed_by `other`); None without one. `run(argv)` gives (rc, out, err),
    `which(name)` a program's path."""
    dpkg_query = which("dpkg-query")
    if dpkg_query:
        _rc, out, _err = run(
            [
                dpkg_query,
                "-W",
                "-f=" + DPKG_QUERY_FORMAT.replace("\\n", "\n"),
                *DPKG_DRIVER_PATTERNS,
            ]
        )
        found = installed_from_dpkg(out)
        if found:
            return found
    rpm = which("rpm")
    if rpm:
        _rc, out, _err = run([rpm, "-qa", "--qf", "%{NAME}|%{VERSION}\n", *RPM_DRIVER_PATTERNS])
        found = installed_from_rpm(out)
        if found:
            return found
    modinfo = which("modinfo")
    if modinfo:
        rc, out, _err = run([modinfo, "-F", "version", "nvidia"])
        if rc == 0 and out.strip():
            return {
                "version": out.strip(),
                "module_type": None,
                "installed_by": "other",
                "package": None,
            }
    return None


def driver_facts(
    loaded_version: str | None, taint: str | None, installed: dict[str, str] | None
) -> dict[str, Any]:
    """Driver state: absent | installed (not loaded) | loaded."""
    if loaded_version:
        state = "loaded"
        version: str | None = loaded_version
    elif installed:
        state = "installed"
        version = installed.get("version")
    else:
        state = "absent"
        version = None
    module_type = (
        module_type_from_taint(taint)
        if loaded_version and taint is not None
        else (installed or {}).get("module_type")
    )
    return {
        "state": state,
        "version": version,
        # What the package database (or modinfo) says is installed; differs from a
        # loaded version until the new module is loaded.
        "installed_version": (installed or {}).get("version"),
        "installed_module_type": (installed or {}).get("module_type"),
        "module_type": module_type,
        "installed_by": (installed or {}).get("installed_by")
        or ("other" if loaded_version else None),
        "package": (installed or {}).get("package"),
        # installed, or how a failed run left the package (dpkg's words): a node
        # between two drivers, which the driver stage finishes.
        "package_state": (installed or {}).get("package_state"),
    }


def _name_source(
    row: dict[str, Any],
    model: gpu_models.GpuModel | None,
    device: int,
    pci_names: dict[int, str] | None,
) -> str | None:
    if row.get("name"):
        return "nvml"
    if model:
        return "pci-id-table"
    return "pci.ids" if device in (pci_names or {}) else None


def gpu_list(
    pci_gpus: list[PciDevice],
    smi_rows: list[dict[str, Any]] | None,
    smi_xml: dict[str, Any] | None,
    cores: dict[int, int] | None = None,
    pci_names: dict[int, str] | None = None,
) -> list[dict[str, Any]]:
    """One entry per GPU; names from NVML when the driver answers, else from the id
    table, else from the node's pci.ids (`pci_names`: a name, but no generation).
    `cores` is cpus.core_indexes' map, for the logical cores local to each GPU."""
    by_bus: dict[str, dict[str, Any]] = {}
    for row in smi_rows or []:
        bus_id = (row.get("pci.bus_id") or "").lower()
        by_bus[bus_id[-12:]] = row  # "00000000:18:00.0" -> "0000:18:00.0"
    xml_by_bus: dict[str, dict[str, Any]] = {}
    for gpu in (smi_xml or {}).get("gpus", []):
        xml_by_bus[(gpu.get("pci_bus_id") or "").lower()[-12:]] = gpu
    result = []
    for device in pci_gpus:
        model = gpu_models.lookup(device.device)
        row = by_bus.get(device.address.lower(), {})
        detail = xml_by_bus.get(device.address.lower(), {})
        compute = row.get("compute_cap")
        if compute:
            major, _, minor = compute.partition(".")
            compute_major: int | None = int(major)
            compute_minor: int | None = int(minor or 0)
        elif model:
            compute_major, compute_minor = model.compute_major, model.compute_minor
        else:
            compute_major = compute_minor = None
        result.append(
            {
                "pci_address": device.address,
                "device_id": f"0x{device.device:04x}",
                "numa_node": device.numa_node,
                # Logical indexes (hwloc's, Slurm's Cores=) of the cores of the CPUs the
                # kernel lists as local to the GPU; [] when sysfs does not say.
                "local_cores": sorted(
                    {(cores or {})[cpu] for cpu in device.local_cpus if cpu in (cores or {})}
                ),
                "bound_driver": device.driver,
                "name": row.get("name")
                or (model.name if model else (pci_names or {}).get(device.device)),
                "name_source": _name_source(row, model, device.device, pci_names),
                "uuid": row.get("uuid"),
                # /dev/nvidia<minor_number>, when the driver answers.
                "minor_number": detail.get("minor_number"),
                "memory_mib": row.get("memory.total") or (model.memory_mib if model else None),
                "compute_major": compute_major,
                "compute_minor": compute_minor,
                "family": gpu_models.family(compute_major, compute_minor or 0)
                if compute_major is not None
                else None,
                "mig_mode": row.get("mig.mode.current"),
                # The mode the GPU takes at its next reset (differs while a change waits).
                "mig_mode_pending": detail.get("mig_mode_pending")
                if row.get("mig.mode.current") is not None
                else None,
                "mig_devices": detail.get("mig_devices", []),
                "persistence_mode": row.get("persistence_mode"),
            }
        )
    return result


def label_value(text: str) -> str:
    """A Kubernetes label value: spaces become '-', other invalid characters are dropped."""
    value = re.sub(r"\s+", "-", text.strip())
    value = re.sub(r"[^A-Za-z0-9._-]", "", value)
    return value[:63].strip("-_.")


def labels(
    gpus: list[dict[str, Any]], driver: dict[str, Any], cuda_version: str | None
) -> dict[str, str]:
    """GPU Feature Discovery's label set, computed from the facts."""
    out: dict[str, str] = {}
    if not gpus:
        out[LABEL_PREFIX + "gpu.present"] = "false"
        return out
    first = gpus[0]
    out[LABEL_PREFIX + "gpu.present"] = "true"
    out[LABEL_PREFIX + "gpu.count"] = str(len(gpus))
    if first.get("name"):
        out[LABEL_PREFIX + "gpu.product"] = label_value(first["name"])
    if first.get("memory_mib"):
        out[LABEL_PREFIX + "gpu.memory"] = str(first["memory_mib"])
    if first.get("family"):
        out[LABEL_PREFIX + "gpu.family"] = first["family"]
    if first.get("compute_major") is not None:
        out[LABEL_PREFIX + "gpu.compute.major"] = str(first["compute_major"])
        out[LABEL_PREFIX + "gpu.compute.minor"] = str(first["compute_minor"])
    if driver.get("state") == "loaded":
        # nvidia-smi reports a MIG mode only for GPUs that support MIG.
        mig_capable = first.get("mig_mode") is not None
        out[LABEL_PREFIX + "mig.capable"] = "true" if mig_capable else "false"
    if driver.get("state") == "loaded" and driver.get("version"):
        parts = driver["version"].split(".")
        out[LABEL_PREFIX + "cuda.driver-version.full"] = driver["version"]
        for key, value in zip(("major", "minor", "revision"), parts):
            out[LABEL_PREFIX + f"cuda.driver-version.{key}"] = value
    if cuda_version:
        major, _, minor = cuda_version.partition(".")
        out[LABEL_PREFIX + "cuda.runtime-version.full"] = cuda_version
        out[LABEL_PREFIX + "cuda.runtime-version.major"] = major
        out[LABEL_PREFIX + "cuda.runtime-version.minor"] = minor or "0"
    return out


# Packages whose presence means an NVIDIA kernel module is installed, and whose
# version is the driver's: Debian (nvidia-kernel-dkms / nvidia-open-kernel-dkms),
# NVIDIA's Debian/Ubuntu repo (nvidia-kernel-open-dkms), Ubuntu (nvidia-dkms-<branch>…,
# nvidia-kernel-common-<branch>-server), RHEL family (kmod-nvidia*).
DPKG_DRIVER_PATTERNS = (
    "nvidia-kernel-dkms",
    "nvidia-open-kernel-dkms",
    "nvidia-kernel-open-dkms",
    "nvidia-dkms-*",
    # Canonical's precompiled linux-modules-nvidia-* carry the kernel's version, not
    # the driver's; the matching nvidia-kernel-common-<branch>-server carries it.
    "nvidia-kernel-common-*",
)
RPM_DRIVER_PATTERNS = ("kmod-nvidia*", "nvidia-kmod*")
DPKG_QUERY_FORMAT = "${db:Status-Abbrev}|${Package}|${Version}\\n"


def upstream_version(package_version: str) -> str:
    """'535.261.03-1~deb12u1' -> '535.261.03'; an epoch is dropped too."""
    version = package_version.split(":", 1)[-1]
    return version.split("-", 1)[0]


# dpkg's current states (the second letter of db:Status-Abbrev) in which a package's
# files are on disk: installed, or left between two versions by a failed or killed
# run (unpacked, half-configured, half-installed, awaiting or pending triggers).
DPKG_PRESENT = {
    "i": "installed",
    "U": "unpacked",
    "F": "half-configured",
    "H": "half-installed",
    "W": "triggers-awaited",
    "t": "triggers-pending",
}


def installed_from_dpkg(output: str) -> dict[str, str] | None:
    for line in output.splitlines():
        fields = line.split("|")
        # db:Status-Abbrev is the wanted state then the current one: "ii" installed,
        # "hi" installed and held, "hF" held and half-configured.
        if len(fields) == 3 and fields[0][1:2] in DPKG_PRESENT:
            package, version = fields[1], fields[2]
            return {
                "version": upstream_version(version),
                "module_type": "open" if "open" in package else "proprietary",
                "installed_by": "package",
                "package": package,
                "package_state": DPKG_PRESENT[fields[0][1]],
            }
    return None


def installed_from_rpm(output: str) -> dict[str, str] | None:
    """Lines of `rpm -q --qf '%{NAME}|%{VERSION}\\n' ...` for installed packages."""
    for line in output.splitlines():
        fields = line.split("|")
        if len(fields) == 2 and "not installed" not in line:
            return {
                "version": fields[1],
                "module_type": "open" if "open" in fields[0] else "proprietary",
                "installed_by": "package",
                "package": fields[0],
            }
    return None


def mig_cap_files(
    gpus: list[dict[str, Any]],
    mig_minors: str | None,
    exists: Callable[[str], bool] = lambda path: True,
) -> None:
    """Give each MIG device of `gpus` (gpu_list's) `cap_files`: the device files of its
    GPU instance's and compute instance's access capabilities, as
    /proc/driver/nvidia-caps/mig-minors numbers them ("gpu0/gi1/access 21" is
    /dev/nvidia-caps/nvidia-cap21; gpuN is the GPU's minor number). [] where the list
    does not name them or a file does not `exist` (a job given the device could not
    open it)."""
    minors = {}
    for line in (mig_minors or "").splitlines():
        name, _, minor = line.partition(" ")
        if minor.strip().isdigit():
            minors[name] = int(minor)
    for gpu in gpus:
        for device in gpu.get("mig_devices") or []:
            base = f"gpu{gpu.get('minor_number')}/gi{device.get('gpu_instance_id')}"
            caps = [f"{base}/access", f"{base}/ci{device.get('compute_instance_id')}/access"]
            files = [f"/dev/nvidia-caps/nvidia-cap{minors[cap]}" for cap in caps if cap in minors]
            device["cap_files"] = files if len(files) == 2 and all(map(exists, files)) else []
