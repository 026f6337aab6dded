#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dpkg_holds
short_description: Hold a set of packages (or release them) in one dpkg call
version_added: 0.2.0
description:
  - Sets dpkg's selection of every package of O(names) to C(hold), or to C(install)
    where O(hold=false) (apt then upgrades them again). What each package has now is read
    with one C(dpkg --get-selections), and only those that differ are changed, with one
    C(dpkg --set-selections); a package set already is left alone.
  - For each package it does what M(ansible.builtin.dpkg_selections) does for one, in
    one module run instead of one per package.
  - A name dpkg does not know (a package not installed yet, as in a check run before
    its install) counts as a change, as with M(ansible.builtin.dpkg_selections); dpkg
    itself ignores it.
  - While another program holds dpkg's lock (an unattended upgrade, an
    administrator's apt), the change is tried again each second for up to O(lock_timeout)
    seconds, as apt waits with C(DPkg::Lock::Timeout); then it fails with dpkg's words,
    which name the holder's pid.
options:
  names:
    description: The packages, as dpkg names them (C(name) or C(name:arch)).
    type: list
    elements: str
    required: true
  hold:
    description: Hold them (V(true)) or release them to C(install) (V(false)).
    type: bool
    default: true
  admindir:
    description: dpkg's database directory (C(dpkg --admindir)).
    type: path
    default: /var/lib/dpkg
  lock_timeout:
    description: Seconds to wait for dpkg's lock.
    type: int
    default: 60
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: debian
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Hold the driver packages against unattended upgrades
  gpufleet.nvidia.dpkg_holds:
    names: [nvidia-kernel-dkms, nvidia-smi, libnvidia-ml1]

- name: Let apt upgrade the toolkit again
  gpufleet.nvidia.dpkg_holds:
    names: [nvidia-container-toolkit, nvidia-container-toolkit-base]
    hold: false
"""

RETURN = r"""
changed_packages:
  description: The packages whose selection changed (or would, in check mode), sorted.
  returned: always
  type: list
  elements: str
selections:
  description: Each package of O(names) and its selection before the run (C(unknown)
    where dpkg does not know it).
  returned: always
  type: dict
"""

import re
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

UNKNOWN = "unknown"
# dpkg's words when another program holds its lock (the frontend lock or the database's).
LOCKED = re.compile(r"(?:was|is) locked by another process")


def parse_selections(output):
    """`dpkg --get-selections` output as {name: selection}; a multi-arch package is
    listed under its name with and without its architecture."""
    selections = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) != 2:
            continue
        name, selection = fields
        selections[name] = selection
        selections.setdefault(name.split(":", 1)[0], selection)
    return selections


def to_change(names, selections, wanted):
    """The names whose selection is not `wanted` yet, in order, each once."""
    changes = []
    for name in names:
        if selections.get(name, UNKNOWN) != wanted and name not in changes:
            changes.append(name)
    return changes


def set_selections(module, dpkg, data):
    """Run `dpkg --set-selections` with `data`, again each second while another program
    holds dpkg's lock, up to lock_timeout; returns (rc, stderr). The selections come
    from a file: dpkg, refused its lock, exits before reading, and a pipe written to
    then would break, losing dpkg's words (which name the holder)."""
    deadline = time.monotonic() + module.params["lock_timeout"]
    with tempfile.NamedTemporaryFile("w", prefix="gpufleet-selections-") as selections:
        selections.write(data)
        selections.flush()
        # sh only redirects: the file is $0, dpkg and its arguments "$@".
        argv = ["sh", "-c", 'exec "$@" < "$0"', selections.name, *dpkg, "--set-selections"]
        while True:
            rc, _out, err = module.run_command(argv)
            if rc == 0 or not LOCKED.search(err) or time.monotonic() >= deadline:
                return rc, err
            time.sleep(1)


def main():
    module = AnsibleModule(
        argument_spec={
            "names": {"type": "list", "elements": "str", "required": True},
            "hold": {"type": "bool", "default": True},
            "admindir": {"type": "path", "default": "/var/lib/dpkg"},
            "lock_timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    names = module.params["names"]
    wanted = "hold" if module.params["hold"] else "install"
    dpkg = [module.get_bin_path("dpkg", required=True), f"--admindir={module.params['admindir']}"]
    result = {"changed": False, "changed_packages": [], "selections": {}}
    if not names:
        module.exit_json(**result)
    rc, out, err = module.run_command([*dpkg, "--get-selections", *names])
    if rc != 0:
        module.fail_json(msg=f"dpkg --get-selections failed: {err.strip()}", **result)
    selections = parse_selections(out)
    result["selections"] = {name: selections.get(name, UNKNOWN) for name in names}
    changes = to_change(names, selections, wanted)
    result["changed_packages"] = sorted(changes)
    result["changed"] = bool(changes)
    if module._diff:
        before = result["selections"]
        after = {name: wanted if name in changes else before[name] for name in before}
        result["diff"] = {"before": before, "after": after}
    if changes and not module.check_mode:
        data = "".join(f"{name} {wanted}\n" for name in changes)
        rc, err = set_selections(module, dpkg, data)
        if rc != 0:
            module.fail_json(msg=f"dpkg --set-selections failed: {err.strip()}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
