# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""RHEL's boot loader entries (BLS): the kernel the node boots next, and gpufleet's
hold of the boot default on a kernel that has the driver's module (grubby, and
UPDATEDEFAULT in /etc/sysconfig/kernel), its record, and its lift."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import bls, kernels
from ansible_collections.gpufleet.nvidia.plugins.module_utils import node_state as ns
from ansible_collections.gpufleet.nvidia.plugins.modules import boot_kernel
from conftest import PROJECT, run_ansible
from runner.words import drift_summary

OLD, NEW = "5.14.0-427.13.1.el9_4.x86_64", "5.14.0-503.11.1.el9_5.x86_64"
MACHINE = "4c1d0e9b2a7f4e6c8d3b5a1f0e2c4d6b"
RECORD = {
    "components": {
        "driver": {"packages": {"kmod-nvidia-latest-dkms": {"version": "3:550.163.01"}}}
    },
    "node": {"driver": {"version": "550.163.01", "module_type": "proprietary"}},
}
# The settings of a RHEL 9 install that matter here (/etc/default/grub, and
# /etc/sysconfig/kernel as the kernel packages read it).
DEFAULT_GRUB = "GRUB_TIMEOUT=5\nGRUB_DEFAULT=saved\nGRUB_ENABLE_BLSCFG=true\n"
SYSCONFIG_KERNEL = (
    "# kernel-install makes each new kernel the default while this says yes\n"
    "UPDATEDEFAULT=yes\n\n# the kernel package new-kernel-pkg would pick\n"
    "DEFAULTKERNEL=kernel-core\n"
)
# A stand-in for grubby's --set-default (grubby itself is RHEL's and cannot be had
# here): the boot loader entry whose linux line names the image becomes GRUB's saved
# entry, as grubby writes it with grub2-editenv.
GRUBBY = """\
#!{python}
import pathlib, sys
option, image = sys.argv[1:3]
assert option == "--set-default", sys.argv
release = image.rsplit("/vmlinuz-", 1)[1]
entries = pathlib.Path({entries!r})
[entry] = [p.stem for p in entries.glob("*.conf") if f"/vmlinuz-{{release}}\\n" in p.read_text()]
pathlib.Path({grubenv!r}).write_text(f"# GRUB Environment Block\\nsaved_entry={{entry}}\\n")
"""


def entry(release: str) -> str:
    """A boot loader entry as RHEL 9's kernel-install writes it (fields that matter)."""
    return (
        f"title Red Hat Enterprise Linux ({release}) 9.5 (Plow)\nversion {release}\n"
        f"linux /vmlinuz-{release}\ninitrd /initramfs-{release}.img $tuned_initrd\n"
        "options root=/dev/mapper/rhel-root ro $tuned_params\ngrub_class rhel\n"
    )


class Node:
    """A RHEL node's /boot, settings and modules under `root`, read as kernels.read
    reads a node (the test machine's own kernel stands for the running one)."""

    def __init__(self, root: Path, saved: str = NEW, built=(OLD,), sysconfig=SYSCONFIG_KERNEL):
        self.root = root
        self.entries = root / "boot" / "loader" / "entries"
        self.entries.mkdir(parents=True)
        (root / "boot" / "grub2").mkdir()
        (root / "boot" / "grub2" / "grub.cfg").write_text('set default="${saved_entry}"\nblscfg\n')
        for release in (OLD, NEW):
            (root / "boot" / f"vmlinuz-{release}").write_bytes(b"")
            (self.entries / f"{MACHINE}-{release}.conf").write_text(entry(release))
        (root / "boot" / f"vmlinuz-0-rescue-{MACHINE}").write_bytes(b"")
        (self.entries / f"{MACHINE}-0-rescue.conf").write_text(entry(f"0-rescue-{MACHINE}"))
        self.grubenv.write_text(f"# GRUB Environment Block\nsaved_entry={MACHINE}-{saved}\n")
        (root / "grub").write_text(DEFAULT_GRUB)
        if sysconfig is not None:
            self.sysconfig.write_text(sysconfig)
        for release in built:
            self.build(release)

    @property
    def grubenv(self) -> Path:
        return self.root / "boot" / "grub2" / "grubenv"

    @property
    def sysconfig(self) -> Path:
        return self.root / "sysconfig-kernel"

    @property
    def hold_file(self) -> Path:
        """In a directory of its own, which the node does not have until a hold."""
        return self.root / "var-lib-gpufleet" / "kernel-hold.conf"

    def build(self, release: str) -> None:
        module = self.root / "modules" / release / "extra" / "nvidia.ko.xz"
        module.parent.mkdir(parents=True)
        module.write_bytes(b"")

    def read(self) -> dict:
        def run(argv: list[str]) -> tuple[int, str, str]:
            release = Path(argv[1]).parts[-3]
            return 0, f"version: 550.163.01\nvermagic: {release} SMP mod_unload\n", ""

        paths = {
            "BOOT_DIR": str(self.root / "boot"),
            "MODULES_DIR": str(self.root / "modules"),
            "GRUBENV_PATHS": (str(self.grubenv),),
            "DKMS_SOURCES": str(self.root / "src"),
            "GRUB_CFG_PATHS": (str(self.root / "boot" / "grub2" / "grub.cfg"),),
            "GRUB_SETTINGS": str(self.root / "grub"),
            "GRUB_SETTINGS_DIR": str(self.root / "grub.d"),
            "BLS_ENTRIES_DIR": str(self.entries),
            "BLS_HOLD_FILE": str(self.hold_file),
            "SYSCONFIG_KERNEL": str(self.sysconfig),
        }
        facts = kernels.read(run, lambda name: f"/usr/sbin/{name}", paths)
        facts["running"] = OLD  # the test machine's kernel otherwise
        facts["modules"].pop(kernels.os.uname().release, None)
        return facts

    def boot_kernel(self, grubby: str | None = "/usr/sbin/grubby") -> dict:
        """What the boot_kernel module returns on this node."""
        facts = self.read()
        found = boot_kernel._hold(_Module(grubby), facts, "550.163.01", None)
        return {"kernel": facts, "problems": kernels.problems(facts, "550.163.01"), **found}


class _Module:
    """What boot_kernel's hold asks of AnsibleModule: where grubby is."""

    def __init__(self, grubby: str | None) -> None:
        self.grubby = grubby

    def get_bin_path(self, name: str) -> str | None:
        return self.grubby if name == "grubby" else None


def test_each_kernels_entry_is_named_by_its_id_and_the_rescue_entry_left_out(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    assert bls.entries(str(node.entries), kernels._read) == {
        OLD: f"{MACHINE}-{OLD}",
        NEW: f"{MACHINE}-{NEW}",
    }
    assert bls.entries(str(tmp_path / "none"), kernels._read) == {}


def test_rhel_boots_the_saved_entry_and_a_newer_kernel_without_its_module_is_named(
    tmp_path: Path,
) -> None:
    """kernel-install made the new kernel the saved entry (UPDATEDEFAULT=yes); DKMS
    had no kernel-devel for it, so it has no module."""
    facts = Node(tmp_path).read()
    assert (facts["boot_next"], facts["boot_next_from"]) == (NEW, "grub saved_entry")
    grub = facts["grub"]
    assert (grub["method"], grub["held"], grub["saved"], grub["updatedefault"]) == (
        "grubby",
        None,
        True,
        "yes",
    )
    assert kernels.problems(facts, "550.163.01") == [
        f"kernel {NEW} is installed and would boot next, but has no nvidia module"
    ]
    assert kernels.fallback(facts, "550.163.01") == OLD


def test_grubby_holds_the_node_on_its_kernel_and_records_the_sites_updatedefault(
    tmp_path: Path,
) -> None:
    found = Node(tmp_path).boot_kernel()
    hold = found["hold"]
    assert hold["release"] == OLD and found["hold_blocked"] is None
    assert hold["set_default"] == ["/usr/sbin/grubby", "--set-default", f"/boot/vmlinuz-{OLD}"]
    assert hold["path"] == str(tmp_path / "var-lib-gpufleet" / "kernel-hold.conf")
    record = bls.assignments(hold["content"])
    assert record == {"HELD": OLD, "HELD_BACK": NEW, "SITE_UPDATEDEFAULT": "yes"}
    assert (
        f"# The node keeps booting {OLD}: kernel {NEW} is installed and would boot next, "
        "but has no nvidia module.\n" in hold["content"]
    )
    assert found["regenerate"] is None and found["lift"] is None


def test_no_hold_without_grubby_or_where_grub_does_not_boot_the_saved_entry(
    tmp_path: Path,
) -> None:
    assert Node(tmp_path / "bare").boot_kernel(grubby=None)["hold"] is None
    node = Node(tmp_path / "zero")
    (node.root / "grub").write_text("GRUB_DEFAULT=0\nGRUB_ENABLE_BLSCFG=true\n")
    found = node.boot_kernel()
    assert found["hold"] is None
    assert found["hold_blocked"] == (
        f"kernel {OLD} has the module, but GRUB_DEFAULT is not 'saved', so GRUB would not "
        "boot the default grubby sets"
    )


def held(tmp_path: Path, updatedefault: str = "yes", **node) -> Node:
    """A node as a hold leaves it: OLD the saved entry, UPDATEDEFAULT=no, the record."""
    found = Node(tmp_path, **node)
    found.hold_file.parent.mkdir()
    found.hold_file.write_text(bls.hold_text(OLD, NEW, updatedefault, "why"))
    found.grubenv.write_text(f"saved_entry={MACHINE}-{OLD}\n")
    found.sysconfig.write_text(SYSCONFIG_KERNEL.replace("UPDATEDEFAULT=yes", "UPDATEDEFAULT=no"))
    return found


def test_a_hold_is_no_drift_until_the_kernel_held_back_has_its_module(tmp_path: Path) -> None:
    node = held(tmp_path)
    facts = node.read()
    assert (facts["boot_next"], facts["grub"]["held"], facts["grub"]["unheld"]) == (OLD, OLD, NEW)
    # The record, not the file the hold changed, says what the site had.
    assert (facts["grub"]["updatedefault"], facts["grub"]["site_updatedefault"]) == ("no", "yes")
    assert ns.kernel_drift(facts, RECORD) == []
    # A run under the hold writes the same record: the site's value is the recorded one.
    again = bls.assignments(node.boot_kernel()["hold"]["content"])
    assert again == {"HELD": OLD, "HELD_BACK": NEW, "SITE_UPDATEDEFAULT": "yes"}
    node.build(NEW)
    [drift] = ns.kernel_drift(node.read(), RECORD)
    assert drift_summary(drift) == (
        f"kernel {NEW} has the driver's module now: the boot default gpufleet held on "
        f"{OLD} can be lifted"
    )
    lift = node.boot_kernel()
    assert lift["hold"] is None
    assert lift["lift"] == {
        "set_default": ["/usr/sbin/grubby", "--set-default", f"/boot/vmlinuz-{NEW}"],
        "updatedefault": "yes",
    }


def test_a_hold_whose_kernel_held_back_is_gone_is_lifted_without_moving_the_default(
    tmp_path: Path,
) -> None:
    """A site whose UPDATEDEFAULT was unset: kernel-install leaves the default alone,
    so the kernel held back was the default only because someone made it so."""
    node = held(tmp_path, updatedefault="")
    (node.root / "boot" / f"vmlinuz-{NEW}").unlink()
    (node.entries / f"{MACHINE}-{NEW}.conf").unlink()
    [drift] = ns.kernel_drift(node.read(), RECORD)
    assert drift_summary(drift) == (
        f"the kernel the node was held back from is gone ({OLD} boots without the hold): "
        f"the boot default gpufleet held on {OLD} can be lifted"
    )
    assert node.boot_kernel()["lift"] == {"set_default": None, "updatedefault": ""}


PLAY = """\
- name: The driver stage's hold on a node that boots BLS entries
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Hold or lift
      ansible.builtin.include_tasks: {tasks}
"""


def run_hold(node: Node, tmp_path: Path, *flags: str, hold: bool = True) -> list[dict]:
    """kernel-hold-bls.yml on this machine, with what boot_kernel reads of `node`;
    returns the results of the tasks that ran (changed or not), by name."""
    grubby = tmp_path / "grubby"
    grubby.write_text(
        GRUBBY.format(python=sys.executable, entries=str(node.entries), grubenv=str(node.grubenv))
    )
    grubby.chmod(0o755)
    play = tmp_path / "hold.yml"
    play.write_text(PLAY.format(tasks=PROJECT / "roles/driver/tasks/kernel-hold-bls.yml"))
    found = node.boot_kernel(grubby=str(grubby))
    extra = {
        "ansible_python_interpreter": sys.executable,
        "driver_kernel_hold": hold,
        "_driver_boot_kernel": found,
    }
    rc, report = run_ansible(
        "ansible-playbook",
        "-i",
        "localhost,",
        "-c",
        "local",
        str(play),
        "-e",
        json.dumps(extra),
        *flags,
    )
    tasks = report["plays"][0]["tasks"]
    assert rc == 0, json.dumps(tasks, indent=1)
    return [
        {"name": t["task"]["name"], **t["hosts"]["localhost"]}
        for t in tasks
        if not t["hosts"]["localhost"].get("skipped")
    ]


def changed(results: list[dict]) -> list[str]:
    return [r["name"] for r in results if r.get("changed")]


@pytest.mark.parametrize("updatedefault", ["yes", None])
def test_the_driver_stage_holds_with_grubby_and_gives_everything_back(
    tmp_path: Path, updatedefault: str | None
) -> None:
    """The role's tasks against a node's files and a stand-in for grubby: the hold, a
    second run that changes nothing, the lift predicted in check mode, the lift."""
    site = SYSCONFIG_KERNEL if updatedefault else "DEFAULTKERNEL=kernel-core\n"
    node = Node(tmp_path / "node", sysconfig=site)
    first = run_hold(node, tmp_path)
    assert changed(first)[:2] == [
        "Keep a directory for gpufleet's record of the hold",
        "Record the hold, the kernel it holds back and the site's UPDATEDEFAULT",
    ]
    assert node.read()["boot_next"] == OLD
    record = bls.assignments(node.hold_file.read_text())
    assert record["SITE_UPDATEDEFAULT"] == (updatedefault or "")
    expected = "UPDATEDEFAULT=no" if updatedefault else "DEFAULTKERNEL=kernel-core"
    assert node.sysconfig.read_text().splitlines()[1 if updatedefault else 0] == expected
    assert changed(run_hold(node, tmp_path)) == []
    node.build(NEW)
    before = (node.sysconfig.read_text(), node.grubenv.read_text())
    predicted = changed(run_hold(node, tmp_path, "--check"))
    assert "Remove gpufleet's record of the hold" in predicted
    assert (node.sysconfig.read_text(), node.grubenv.read_text()) == before
    assert node.hold_file.exists()
    lifted = changed(run_hold(node, tmp_path))
    assert lifted[-1] == "Remove gpufleet's record of the hold"
    assert node.sysconfig.read_text() == site
    assert node.read()["boot_next"] == NEW and not node.hold_file.exists()
    assert changed(run_hold(node, tmp_path)) == []
