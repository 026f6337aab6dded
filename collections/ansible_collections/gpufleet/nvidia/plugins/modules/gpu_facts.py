#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Discover NVIDIA GPUs, NVSwitches and the driver state of a node
version_added: 0.1.0
description:
  - Reads the PCI devices under I(sysfs_root) to find NVIDIA GPUs (PCI class 0x0300 or
    0x0302) and NVSwitch chips (class 0x0680).
  - Reports whether an NVIDIA kernel module is absent, installed or loaded, which
    version and type (open or proprietary), and whether a package installed it.
  - When the driver is loaded, asks C(nvidia-smi) for names, UUIDs, memory, MIG and
    persistence modes and the CUDA version; otherwise names GPUs from a PCI
    device-id table.
  - Computes the label set GPU Feature Discovery would publish for the node.
  - Reads only; changes nothing, so it is safe in check mode.
options:
  sysfs_root:
    description:
      - Root of the sysfs tree to read. C(/sys) on a host; another path reads a host
        sysfs mounted elsewhere.
    type: path
    default: /sys
  query_driver:
    description:
      - Call C(nvidia-smi) when the nvidia module is loaded.
    type: bool
    default: true
  kernel_log:
    description:
      - Read the driver's Xid events from the kernel's log (C(/dev/kmsg)) into the
        C(health) fact; with C(false) its C(xid_events) is null (not read). The stages
        that read the facts only for the GPUs' identity and driver leave it out.
    type: bool
    default: true
  health_actions:
    description:
      - A site's changes to the action each health signal asks for (the table is in
        docs/health.md) - signal kind (for example C(ecc-dbe)) or C(xid:<number>) to
        one of C(none), C(watch), C(reset), C(reboot), C(replace).
    type: dict
    default: {}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Discover the node's GPUs
  gpufleet.nvidia.gpu_facts:

- name: Read a host sysfs mounted at /host/sys
  gpufleet.nvidia.gpu_facts:
    sysfs_root: /host/sys

- name: Show the node's GPU labels
  ansible.builtin.debug:
    var: ansible_facts.gpufleet.labels
"""

RETURN = r"""
ansible_facts:
  description: Facts under the key C(gpufleet).
  returned: always
  type: dict
  contains:
    gpufleet:
      description: GPU discovery results.
      type: dict
      contains:
        gpu_count:
          description: Number of NVIDIA GPUs on the PCI bus.
          type: int
          sample: 8
        gpus:
          description: One entry per GPU (PCI address, device id, name and
            C(name_source) (nvml, pci-id-table, or pci.ids, the node's PCI ID list, for
            a GPU gpufleet's table lacks, which gives a name and no generation), memory in MiB,
            NUMA node, C(local_cores) (logical indexes of the cores near it), compute
            capability, family, UUID and C(minor_number) when the driver answers; on a
            GPU with MIG C(mig_mode), C(mig_mode_pending) (the mode its next reset
            brings) and C(mig_devices), each with its C(profile) and C(cap_files) (the
            capability device files of its instances)).
          type: list
          elements: dict
        core_count:
          description: Number of CPU cores of the node as sysfs shows them (0 unknown).
          type: int
          sample: 64
        nvswitch_count:
          description: Number of NVSwitch chips on the PCI bus.
          type: int
          sample: 4
        driver:
          description: C(state) (absent, installed, loaded), C(version) (the loaded one
            when loaded), C(installed_version), C(module_type) (open, proprietary; of the
            loaded module when loaded), C(installed_module_type),
            C(installed_by) (package, other), C(package), C(package_state) (installed,
            or how a failed run left the module's package - unpacked, half-configured,
            half-installed, triggers-awaited, triggers-pending).
          type: dict
        cuda_version:
          description: CUDA version the loaded driver supports, when it answers.
          type: str
          sample: "12.2"
        persistence_mode:
          description: True when every GPU is in persistence mode; null when unknown.
          type: bool
        nouveau_loaded:
          description: Whether the nouveau module is loaded.
          type: bool
        secure_boot:
          description: C(enabled), C(disabled) or C(unsupported) (no EFI).
          type: str
        secure_boot_enrolled:
          description:
            - SHA-256 fingerprints (lower-case hex) of the certificates the node trusts
              for kernel modules under Secure Boot - shim's Machine Owner Key list
              (C(MokListRT)) and the firmware's C(db); empty without EFI.
          type: list
          elements: str
        os:
          description: C(id), C(version_id) and C(kernel) of the node.
          type: dict
        container_runtimes:
          description: Container runtime daemons installed (containerd, dockerd, crio).
          type: list
          elements: str
        labels:
          description: GPU Feature Discovery style labels (C(nvidia.com/...)).
          type: dict
          sample: {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"}
        health:
          description:
            - C(action), the most severe action the GPUs' present signals ask for
              (C(none), C(watch), C(reset), C(reboot), C(replace)); each GPU's own in
              its C(health) (C(action), C(signals), each with C(kind), C(action) and
              C(detail)), null where nvidia-smi did not answer.
            - C(xid_events), the driver's Xid lines still in the kernel's log buffer, oldest
              first (C(seq), C(usec), C(pci_address), C(xid), C(pid), C(process),
              C(message), C(action), C(meaning)); null where the log cannot be read,
              C(kernel_log_error) saying why. C(boot_id) tells a boot's events from the next's.
          type: dict
        smi_error:
          description: Why nvidia-smi gave no answer although the module is loaded.
          type: str
"""

import os
import platform

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils import (
    cpus,
    discovery,
    gpu_health,
    gpu_models,
    pci,
    secureboot,
    smi,
)

# The device minor of every MIG capability, as the loaded nvidia module lists them.
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"


def _read(path, mode="r"):
    try:
        with open(path, mode) as handle:
            return handle.read()
    except OSError:
        return None


def _os_release():
    data = {}
    for line in (_read("/etc/os-release") or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            data[key] = value.strip().strip('"')
    return {
        "id": data.get("ID"),
        "version_id": data.get("VERSION_ID"),
        "kernel": platform.release(),
    }


def _query_smi(module, unreachable):
    """(csv rows, xml facts, error) from nvidia-smi; fills `unreachable` with the GPUs it
    could not open."""
    binary = module.get_bin_path("nvidia-smi")
    if not binary:
        return None, None, "nvidia-smi is not installed"
    rows, lost, error = gpu_health.query(module.run_command, binary, smi.QUERY_FIELDS)
    unreachable.update(lost)
    if rows is None:
        return None, None, error
    rc, out, err = module.run_command([binary, "-q", "-x"])
    if rc != 0:
        return rows, None, f"nvidia-smi -q -x exited {rc}: {(out or err).strip()}"
    xml = smi.parse_query_xml(out)
    if any(row.get("mig.mode.current") for row in rows):
        # -q -x does not name a MIG device's profile; -L does, in the same order.
        rc, out, err = module.run_command([binary, "-L"])
        if rc != 0:
            return rows, xml, f"nvidia-smi -L exited {rc}: {(out or err).strip()}"
        smi.name_mig_devices(xml, smi.parse_list(out))
    return rows, xml, None


def _pci_names(gpus):
    """The node's pci.ids names of NVIDIA devices, read only where a GPU is neither named
    by the driver nor in gpufleet's own table; {} where the node has no pci.ids."""
    if all(gpu_models.lookup(gpu.device) for gpu in gpus):
        return {}
    for path in pci.PCI_IDS_PATHS:
        text = _read(path)
        if text:
            return pci.pci_ids_names(text)
    return {}


def _health(rows, unreachable, gpu_list, overrides, answered, kernel_log=True):
    """The node's health facts; each GPU's own go into its entry of `gpu_list`. The
    kernel's log is read only with `kernel_log` (and where the node has GPUs)."""
    addresses = [gpu["pci_address"] for gpu in gpu_list]
    by_address = gpu_health.gpu_health(rows, unreachable, overrides, addresses)
    for gpu in gpu_list:
        gpu["health"] = by_address.get(gpu["pci_address"]) if answered or unreachable else None
    if not gpu_list:
        log, log_error = "", None
    elif kernel_log:
        log, log_error = gpu_health.read_kernel_log()
    else:
        log, log_error = None, None
    health = {
        "action": gpu_health.worst(h["action"] for h in by_address.values()),
        "xid_events": None if log is None else gpu_health.parse_kmsg(log, overrides),
        "boot_id": (_read(gpu_health.BOOT_ID) or "").strip() or None,
    }
    if log_error:
        health["kernel_log_error"] = log_error
    return health


def gather(module, sysfs_root, query_driver, overrides=None, kernel_log=True):
    devices = pci.scan(sysfs_root)
    gpus = pci.nvidia_gpus(devices)
    switches = pci.nvswitches(devices)
    module_dir = os.path.join(sysfs_root, "module")
    loaded_version = (_read(os.path.join(module_dir, "nvidia", "version")) or "").strip() or None
    taint = _read(os.path.join(module_dir, "nvidia", "taint"))
    installed = (
        discovery.installed_driver(module.run_command, module.get_bin_path) if gpus else None
    )
    driver = discovery.driver_facts(loaded_version, taint.strip() if taint else None, installed)

    rows = xml = None
    smi_error = None
    unreachable = {}
    if gpus and loaded_version and query_driver:
        try:
            rows, xml, smi_error = _query_smi(module, unreachable)
        except smi.SmiParseError as exc:
            smi_error = str(exc)
    cores = cpus.core_indexes(sysfs_root)
    gpu_list = discovery.gpu_list(gpus, rows, xml, cores, _pci_names(gpus))
    if any(gpu["mig_devices"] for gpu in gpu_list):
        discovery.mig_cap_files(gpu_list, _read(MIG_MINORS), os.path.exists)
    cuda_version = (xml or {}).get("cuda_version")
    persistence = [g["persistence_mode"] for g in gpu_list if g["persistence_mode"] is not None]

    efi_dir = os.path.join(sysfs_root, "firmware", "efi")
    efivar = _read(
        os.path.join(efi_dir, "efivars", f"SecureBoot-{discovery.EFI_GLOBAL_GUID}"), "rb"
    )
    runtimes = [name for name in ("containerd", "dockerd", "crio") if module.get_bin_path(name)]
    facts = {
        "sysfs_root": sysfs_root,
        "gpu_count": len(gpus),
        "gpus": gpu_list,
        # Cores of the node, as numbered for local_cores (0 when sysfs does not say).
        "core_count": len(set(cores.values())),
        "nvswitch_count": len(switches),
        "nvswitches": [s.as_dict() for s in switches],
        "driver": driver,
        "cuda_version": cuda_version,
        "persistence_mode": all(persistence) if persistence else None,
        "nouveau_loaded": os.path.isdir(os.path.join(module_dir, "nouveau")),
        "secure_boot": discovery.secure_boot_state(efivar, os.path.isdir(efi_dir)),
        "secure_boot_enrolled": secureboot.enrolled(efi_dir),
        "os": _os_release(),
        "container_runtimes": runtimes,
        "labels": discovery.labels(gpu_list, driver, cuda_version),
        "health": _health(rows, unreachable, gpu_list, overrides, rows is not None, kernel_log),
    }
    if smi_error:
        facts["smi_error"] = smi_error
    return facts


def main():
    module = AnsibleModule(
        argument_spec={
            "sysfs_root": {"type": "path", "default": "/sys"},
            "query_driver": {"type": "bool", "default": True},
            "kernel_log": {"type": "bool", "default": True},
            "health_actions": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    sysfs_root = module.params["sysfs_root"]
    if not os.path.isdir(os.path.join(sysfs_root, "bus", "pci")):
        module.fail_json(
            msg=f"sysfs_root={sysfs_root!r} has no bus/pci directory; "
            "expected the root of a sysfs tree such as /sys"
        )
    try:
        overrides = gpu_health.check_overrides(module.params["health_actions"])
    except gpu_health.HealthInputError as exc:
        module.fail_json(msg=f"health_actions (gpu_health_actions): {exc}")
    params = module.params
    facts = gather(module, sysfs_root, params["query_driver"], overrides, params["kernel_log"])
    module.exit_json(changed=False, ansible_facts={"gpufleet": facts})


if __name__ == "__main__":
    main()
