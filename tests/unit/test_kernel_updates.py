# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""driver_kernel_updates: held: which kernel packages the driver stage holds, and which
of those holds are gpufleet's to release again (docs/kernels.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible_collections.gpufleet.nvidia.plugins.filter.driver import driver_kernel_holds
from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_updates
from conftest import PROJECT, run_ansible

# What dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' prints for the patterns on a
# Debian node: the site held the headers metapackage itself; an old kernel was removed
# with its configuration kept (rc), and a half-installed one is not installed whole.
DPKG = """\
ii  linux-image-6.1.0-41-amd64
ii  linux-image-amd64
hi  linux-headers-amd64
ii  linux-headers-6.1.0-41-amd64
ii  linux-headers-6.1.0-41-common
rc  linux-image-6.1.0-9-amd64
iU  linux-image-6.1.0-42-amd64
un  linux-modules-nvidia-535-server-generic
"""
DEBIAN_KERNEL = [
    "linux-headers-6.1.0-41-amd64",
    "linux-headers-6.1.0-41-common",
    "linux-headers-amd64",
    "linux-image-6.1.0-41-amd64",
    "linux-image-amd64",
]


def test_every_installed_kernel_package_is_held_and_the_sites_own_hold_is_not_gpufleets():
    holds = driver_kernel_holds(DPKG, "debian")
    assert holds["hold"] == DEBIAN_KERNEL
    # linux-headers-amd64 was held before gpufleet held anything: the site's.
    assert holds["owned"] == [name for name in DEBIAN_KERNEL if name != "linux-headers-amd64"]


def test_once_held_gpufleets_list_keeps_its_own_and_drops_what_is_gone():
    held_now = DPKG.replace("ii  ", "hi  ")
    before = [*DEBIAN_KERNEL[1:], "linux-image-6.1.0-9-amd64"]  # one was purged since
    before.remove("linux-headers-amd64")
    holds = driver_kernel_holds(held_now, "debian", owned=before)
    assert holds["owned"] == [name for name in DEBIAN_KERNEL[1:] if name != "linux-headers-amd64"]
    # A kernel package installed since (by hand, held by nobody) becomes gpufleet's.
    newer = held_now + "ii  linux-image-6.12.57+deb12-amd64\n"
    holds = driver_kernel_holds(newer, "debian", owned=before)
    assert "linux-image-6.12.57+deb12-amd64" in holds["owned"]


def test_the_drivers_own_held_packages_are_left_to_the_driver():
    ubuntu = "ii  linux-image-generic\nhi  linux-modules-nvidia-535-server-6.8.0-49-generic\n"
    holds = driver_kernel_holds(
        ubuntu,
        "ubuntu",
        exclude=["linux-modules-nvidia-535-server-6.8.0-49-generic=6.8.0-49.49"],
    )
    assert holds == {"hold": ["linux-image-generic"], "owned": ["linux-image-generic"]}


def test_rhel_kernel_packages_count_as_held_where_dnfs_versionlock_locks_them():
    rpm = "kernel\nkernel-core\nkernel-modules\npackage kernel-modules-extra is not installed\n"
    locked = "# Added lock\nkernel-core-0:5.14.0-427.13.1.el9_4.*\n"
    holds = driver_kernel_holds(rpm, "rhel", locked=locked)
    assert holds == {
        "hold": ["kernel", "kernel-core", "kernel-modules"],
        "owned": ["kernel", "kernel-modules"],
    }


def test_gpufleets_list_reads_back_without_its_comments_and_is_none_without_the_file():
    assert kernel_updates.owned(None) is None
    assert kernel_updates.owned("# Kernel packages gpufleet holds\n") == []
    assert kernel_updates.owned("# x\nlinux-image-amd64\n\nlinux-image-amd64\n") == [
        "linux-image-amd64"
    ]


PLAY = """\
- name: The driver stage's kernel holds
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Hold, or stop
      ansible.builtin.include_tasks: {tasks}
"""


def test_a_newer_kernel_that_would_boot_instead_of_the_release_stops_the_stage_naming_both(
    tmp_path: Path,
):
    """kernel-updates.yml as the driver stage runs it after kernel.yml, with what
    boot_kernel read: the release is installed, a newer kernel would boot."""
    play = tmp_path / "holds.yml"
    play.write_text(PLAY.format(tasks=PROJECT / "roles/driver/tasks/kernel-updates.yml"))
    extra = {
        "ansible_python_interpreter": sys.executable,
        "driver_kernel_updates": "held",
        "driver_kernel_release": "6.1.0-41-amd64",
        "_driver_plan": {"family": "debian"},
        "_driver_boot_kernel": {
            "kernel": {
                "boot_next": "6.12.57+deb12-amd64",
                "boot_next_from": "newest installed",
                "held_packages": None,
            }
        },
    }
    rc, report = run_ansible(
        "ansible-playbook", "-i", "localhost,", "-c", "local", str(play), "-e", json.dumps(extra)
    )
    [task] = [t for t in report["plays"][0]["tasks"] if t["hosts"]["localhost"].get("failed")]
    said = " ".join(task["hosts"]["localhost"]["msg"].split())
    assert rc == 2
    assert said == (
        "driver_kernel_release is 6.1.0-41-amd64, but localhost would boot kernel "
        "6.12.57+deb12-amd64 next (newest installed). Remove that kernel (apt purge "
        "linux-image-6.12.57+deb12-amd64, dnf remove kernel-core-6.12.57+deb12-amd64), make "
        "6.1.0-41-amd64 the boot default, or name 6.12.57+deb12-amd64 in driver_kernel_release."
    )
    # Nothing ran before it: no package listed, held or written.
    assert [t["task"]["name"] for t in report["plays"][0]["tasks"]] == [
        "Hold, or stop",
        "Stop where another kernel than driver_kernel_release would boot",
    ]
