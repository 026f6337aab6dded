#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_holders
short_description: Find the processes that hold a node's NVIDIA GPUs
version_added: 0.1.0
description:
  - Lists every process that has an NVIDIA GPU device file (C(/dev/nvidia0),
    C(/dev/nvidia1), ...) open, as the kernel counts the driver's users; while any such
    process runs, the GPU cannot be reset (a MIG mode change) nor the driver unloaded.
  - For each process it reports the command line and the systemd unit it runs in, so a
    known GPU service can be told from a job or a program run by hand.
  - Reads C(/proc) only; changes nothing, so it is safe in check mode. Processes of
    other users are seen only when run as root.
options:
  dev_dir:
    description:
      - Where the device files are. C(/dev) on a host.
    type: path
    default: /dev
  exclude_units:
    description:
      - Systemd units whose processes are left out (services about to be stopped, or
        already known). A name without a unit suffix is a service (C(dcgm) is
        C(dcgm.service)), as systemctl takes it.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Find what holds the GPUs besides the services the role manages
  gpufleet.nvidia.gpu_holders:
    exclude_units: [nvidia-persistenced.service, nvidia-dcgm.service]
  register: holders

- name: Stop when something else holds a GPU
  ansible.builtin.fail:
    msg: "{{ holders.summary }}"
  when: holders.holders | length > 0
"""

RETURN = r"""
holders:
  description: One entry per process holding a GPU device file, by pid.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    name:
      description: Command name (C(/proc/PID/comm)).
      type: str
    cmdline:
      description: Command line, arguments separated by spaces.
      type: str
    unit:
      description: The systemd unit the process runs in (a service or a scope), or
        null when it runs in none.
      type: str
    gpus:
      description: Indexes of the GPUs whose device files it holds.
      type: list
      elements: int
  sample:
    - {pid: 4242, name: python3, cmdline: "python3 train.py", unit: session-3.scope, gpus: [0, 1]}
gpus:
  description: The held GPUs, by index, with the pids holding each.
  returned: always
  type: dict
  sample: {"0": [4242], "1": [4242]}
summary:
  description: One sentence naming each holder (pid, command line, unit, GPUs); empty
    when nothing holds a GPU.
  returned: always
  type: str
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

_GPU_FILE = re.compile(r"nvidia(\d+)$")
# The unit is the last component of the process's systemd cgroup path.
_UNIT = re.compile(r"/([^/]+\.(?:service|scope))$")


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return None


def unit_of(cgroup_text):
    """The systemd unit of a process from /proc/PID/cgroup (v2 "0::/path" or v1
    "N:name=systemd:/path"), or None."""
    for line in (cgroup_text or "").splitlines():
        _hierarchy, _sep, rest = line.partition(":")
        controllers, _sep, path = rest.partition(":")
        if controllers in ("", "name=systemd"):
            match = _UNIT.search(path.strip())
            if match:
                return match.group(1)
    return None


def unit_name(name):
    """A unit's full name: systemctl's reading of a name without a suffix is a service."""
    return name if re.search(r"\.[a-z]+$", name) else f"{name}.service"


def find_holders(dev_dir, proc_dir="/proc", exclude_units=(), own_pid=None):
    """Processes with a GPU device file of `dev_dir` open, sorted by pid."""
    gpu_files = {}
    try:
        names = os.listdir(dev_dir)
    except OSError:
        names = []
    for name in names:
        match = _GPU_FILE.match(name)
        if match:
            gpu_files[os.path.join(dev_dir, name)] = int(match.group(1))
    holders = []
    if not gpu_files:
        return holders
    for entry in os.listdir(proc_dir):
        if not entry.isdigit() or int(entry) == own_pid:
            continue
        fd_dir = os.path.join(proc_dir, entry, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to read
        held = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue  # closed meanwhile
            if target in gpu_files:
                held.add(gpu_files[target])
        if not held:
            continue
        unit = unit_of(_read(os.path.join(proc_dir, entry, "cgroup")))
        if unit in exclude_units:
            continue
        cmdline = (_read(os.path.join(proc_dir, entry, "cmdline")) or "").replace("\0", " ")
        holders.append(
            {
                "pid": int(entry),
                "name": (_read(os.path.join(proc_dir, entry, "comm")) or "?").strip(),
                "cmdline": cmdline.strip(),
                "unit": unit,
                "gpus": sorted(held),
            }
        )
    return sorted(holders, key=lambda holder: holder["pid"])


def summary(holders):
    parts = []
    for holder in holders:
        where = f" in {holder['unit']}" if holder["unit"] else ""
        gpus = ", ".join(str(index) for index in holder["gpus"])
        parts.append(
            f"pid {holder['pid']} ({holder['cmdline'] or holder['name']}){where} holds GPU {gpus}"
        )
    return "; ".join(parts)


def main():
    module = AnsibleModule(
        argument_spec={
            "dev_dir": {"type": "path", "default": "/dev"},
            "exclude_units": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    dev_dir = module.params["dev_dir"]
    if not os.path.isdir(dev_dir):
        module.fail_json(msg=f"dev_dir={dev_dir!r} is not a directory; expected /dev")
    excluded = {unit_name(name) for name in module.params["exclude_units"]}
    holders = find_holders(dev_dir, exclude_units=excluded, own_pid=os.getpid())
    gpus = {}
    for holder in holders:
        for index in holder["gpus"]:
            gpus.setdefault(str(index), []).append(holder["pid"])
    module.exit_json(changed=False, holders=holders, gpus=gpus, summary=summary(holders))


if __name__ == "__main__":
    main()
