#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible module: record what an apply left on a node, or probe whether it still holds."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_state
short_description: Record a node's managed state after an apply, or probe it for drift
version_added: 0.1.0
description:
  - With O(state=record), reads the current state of the files, packages and services
    each component (a stage of C(site.yml)) manages, and of the node itself, and writes
    it to O(path). site.yml does this at the end of a pass in which every stage passed
    on the node, so the record means "what the last successful apply left".
  - With O(state=probe), reads the record and compares the node with it, taking the
    list of what to check from the record itself (so the probe needs no variables),
    and reports each difference. It changes nothing. The reconcile loop runs this as a
    cheap drift check before deciding to converge a node.
  - "What is recorded: per file its sha256, mode, owner and group (null when missing);
    per package its installed version and whether it is held (null when not
    installed); per service its C(UnitFileState) and C(ActiveState); for the node the
    loaded NVIDIA driver's version and module type (read from sysfs as
    M(gpufleet.nvidia.gpu_facts) does) and the MIG mode of each GPU."
  - "The programs it runs, whatever the number of items: one C(dpkg-query) (versions
    and holds) or one C(rpm -q) (holds from dnf's C(versionlock.list)), one
    C(systemctl show), and one C(nvidia-smi) when the nvidia module is loaded (three on
    drivers whose C(--query-gpu) lacks the remapped rows, such as 535), which also gives
    the GPUs' health; the kernel's log is read from C(/dev/kmsg)."
  - The record is JSON with sorted keys and no timestamps, so an unchanged node gives
    a byte-identical file; it is written atomically (a temporary file in the same
    directory, then a rename), mode C(0600), in a directory of mode C(0700).
options:
  state:
    description:
      - C(probe) compares the node with the record; C(record) writes the record.
    type: str
    default: probe
    choices: [probe, record]
  path:
    description: The record file.
    type: path
    default: /var/lib/gpufleet/applied.json
  components:
    description:
      - Required with O(state=record), ignored with O(state=probe). Component name
        (for example C(toolkit)) to a dict of what it manages on this node, each key
        optional - C(files) (absolute paths of the files it writes), C(packages)
        (package names, without versions or globs) and C(services) (systemd units it
        enables or runs).
      - An empty dict records only the node's own state (a node without GPUs).
    type: dict
  sysfs_root:
    description:
      - Root of the sysfs tree the loaded driver is read from (as for
        M(gpufleet.nvidia.gpu_facts)).
    type: path
    default: /sys
  health_actions:
    description:
      - With O(state=probe), a site's changes to the action each health signal asks
        for, as for M(gpufleet.nvidia.gpu_facts).
    type: dict
    default: {}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: With O(state=record) nothing is written; C(changed) says whether it would be.
  diff_mode:
    support: full
    details: With O(state=record), the record's text before and after.
  platform:
    platforms: posix
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Record what the stages manage on this node
  gpufleet.nvidia.node_state:
    state: record
    components:
      toolkit:
        files: [/etc/cdi/nvidia.yaml]
        packages: [nvidia-container-toolkit]
        services: [nvidia-cdi-refresh.path]

- name: Probe the node's managed state
  gpufleet.nvidia.node_state:
  register: _probe

- name: Say what drifted
  ansible.builtin.debug:
    var: _probe.drift
  when: _probe.drifted
"""

RETURN = r"""
digest:
  description:
    - sha256 of the record file's bytes. With O(state=record), of the record written
      (or that would be, in check mode); with O(state=probe), of the file read (null
      when there is none or it cannot be read).
  returned: always
  type: str
  sample: 3f0c2e9d3b1c4e0f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f
recorded:
  description:
    - Whether a usable record was found. False when there is none, or it cannot be
      read, is not valid JSON, or has another schema; RV(reason) says which.
  returned: when state is probe
  type: bool
reason:
  description: Why there is no usable record; empty when there is one.
  returned: when state is probe
  type: str
  sample: "no record at /var/lib/gpufleet/applied.json"
drifted:
  description:
    - Whether the node differs from the record. Also true when there is no usable
      record (RV(recorded) false), since nothing then shows the node is as last applied.
  returned: when state is probe
  type: bool
drift:
  description:
    - Component name to the items that differ from the record, each with C(kind)
      (C(file), C(package), C(service), C(driver), C(kernel) or C(mig)), C(name)
      (path, package, unit, C(nvidia), a kernel release or a GPU's PCI address),
      C(recorded) and C(current) (the states as recorded; null means missing, not
      installed or unknown). A difference of the node itself (driver, MIG mode) is
      listed under C(driver). Empty when nothing differs or there is no record.
    - "C(kernel) drift is not a difference from the record but a kernel that would
      boot next without the nvidia module of the recorded driver (no module, another
      version, built for another kernel, or not signed with the site's key where the
      driver stage wrote one to /var/lib/gpufleet/module-signing/mok.pem), or one
      gpufleet's GRUB hold keeps the node from that has its module now; its C(reason)
      says which, and C(recorded) and C(current) hold the driver's and the module's
      version under C(nvidia)."
  returned: when state is probe
  type: dict
  sample:
    runtime_config:
      - kind: file
        name: /etc/containerd/config.toml
        recorded: {sha256: "9c1e...", mode: "0644", owner: root, group: root}
        current: {sha256: "47aa...", mode: "0644", owner: root, group: root}
health:
  description:
    - The GPUs' health now and the driver's Xid events still in the kernel's log, read
      as M(gpufleet.nvidia.gpu_facts) reads them (its C(health) fact), each GPU's under
      C(gpus) keyed by PCI address (null where nvidia-smi did not answer). Not part of
      the record, so it never counts as drift.
  returned: when state is probe
  type: dict
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_health as gh
from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernels
from ansible_collections.gpufleet.nvidia.plugins.module_utils import node_state as ns

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def _reader(module):
    def run(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    return ns.Reader(run, module.get_bin_path, module.params["sysfs_root"])


def _read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def _mode(path):
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None


def _write(path, text):
    """Replace `path` with `text` atomically: a 0600 temporary file in the same directory."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=DIRECTORY_MODE, exist_ok=True)
    if _mode(directory) != DIRECTORY_MODE:
        os.chmod(directory, DIRECTORY_MODE)
    handle, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def record(module):
    path = module.params["path"]
    try:
        components = ns.normalize_components(module.params["components"])
    except ns.NodeStateError as exc:
        module.fail_json(msg=str(exc))
    reader = _reader(module)
    text = ns.render(ns.current_record(reader, components))
    try:
        before = _read_bytes(path).decode("utf-8", "replace")
    except FileNotFoundError:
        before = None
    except OSError as exc:
        module.fail_json(msg=f"cannot read {path}: {exc}")
    changed = (
        before != text or _mode(path) != FILE_MODE or _mode(os.path.dirname(path)) != DIRECTORY_MODE
    )
    if changed and not module.check_mode:
        try:
            _write(path, text)
        except OSError as exc:
            module.fail_json(msg=f"cannot write {path}: {exc}")
    for warning in reader.warnings:
        module.warn(warning)
    result = {"changed": changed, "digest": ns.digest(text)}
    if module._diff:
        result["diff"] = {
            "before_header": path,
            "after_header": path,
            "before": before or "",
            "after": text,
        }
    module.exit_json(**result)


def probe(module, overrides):
    path = module.params["path"]
    reader = _reader(module)
    result = {"changed": False, "digest": None}

    def finish(**outcome):
        result["health"] = reader.health(overrides)
        for warning in reader.warnings:
            module.warn(warning)
        module.exit_json(**outcome, **result)

    def no_record(reason):
        finish(recorded=False, reason=reason, drifted=True, drift={})

    try:
        data = _read_bytes(path)
    except FileNotFoundError:
        no_record(f"no record at {path}")
    except OSError as exc:
        no_record(f"record at {path} unreadable: {exc.strerror or exc}")
    result["digest"] = ns.digest(data)
    try:
        recorded = ns.load(data)
    except ns.RecordError as exc:
        no_record(f"record at {path} {exc}")
    current = ns.current_record(reader, ns.components_of(recorded))
    drift = ns.compare(recorded, current)
    kernel = kernels.read(reader.run, reader.which)
    for entry in ns.kernel_drift(kernel, recorded, _signing_key(module, reader)):
        drift.setdefault(ns.NODE_COMPONENT, []).append(entry)
    finish(recorded=True, reason="", drifted=bool(drift), drift=drift)


def _signing_key(module, reader):
    """The serial of the site's module-signing certificate where the driver stage wrote
    one (DKMS signs with it); None without one. One it cannot read is said, not fatal:
    the probe goes on without the signature check."""
    if not os.path.exists(kernels.SITE_CERTIFICATE):
        return None
    serial, why = kernels.certificate_serial(
        reader.run, reader.which("openssl"), kernels.SITE_CERTIFICATE
    )
    if why:
        module.warn(f"{kernels.SITE_CERTIFICATE}: {why}; module signatures not checked")
    return serial


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "default": "probe", "choices": ["probe", "record"]},
            "path": {"type": "path", "default": ns.DEFAULT_PATH},
            # Validated by node_state.normalize_components, which names the item at fault.
            "components": {"type": "dict"},
            "sysfs_root": {"type": "path", "default": "/sys"},
            "health_actions": {"type": "dict", "default": {}},
        },
        required_if=[("state", "record", ("components",))],
        supports_check_mode=True,
    )
    if module.params["state"] == "record":
        record(module)
    else:
        try:
            overrides = gh.check_overrides(module.params["health_actions"])
        except gh.HealthInputError as exc:
            module.fail_json(msg=f"health_actions (gpu_health_actions): {exc}")
        probe(module, overrides)


if __name__ == "__main__":
    main()
