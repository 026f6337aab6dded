# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""GRUB's menu as grub-mkconfig writes it (fixtures/grub), the kernel it boots next,
and gpufleet's hold of the boot default on a kernel that has the driver's module."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import grub, kernels
from ansible_collections.gpufleet.nvidia.plugins.module_utils import node_state as ns
from ansible_collections.gpufleet.nvidia.plugins.modules import boot_kernel
from runner.words import drift_summary

FIXTURES = Path(__file__).parent / "fixtures" / "grub"
OLD, NEW = "6.1.0-50-amd64", "6.1.0-56-amd64"
UUID = "0b9c6f5e-7d33-4b59-9b1a-5a4a1c2f3e11"
OLD_ENTRY = f"gnulinux-advanced-{UUID}>gnulinux-{OLD}-advanced-{UUID}"


def menu(name: str) -> dict:
    return grub.parse_cfg((FIXTURES / name).read_text())


def test_the_menu_lists_each_kernel_newest_first_with_its_entry() -> None:
    found = menu("debian12-two-kernels.cfg")
    assert found["default"] == "0"
    assert [e["id"] for e in found["entries"]] == [
        f"gnulinux-simple-{UUID}",
        f"gnulinux-advanced-{UUID}",
    ]
    # The plain entry, then each kernel's normal and recovery entries in the submenu.
    assert grub.releases(found["entries"]) == [NEW, NEW, NEW, OLD, OLD]
    assert grub.entry_path(found["entries"], OLD) == OLD_ENTRY
    assert grub.entry_path(found["entries"], "6.1.0-9-amd64") is None


@pytest.mark.parametrize(
    ("default", "release"),
    [
        ("0", NEW),
        ("1", NEW),  # a submenu boots its first entry
        ("1>2", OLD),
        (OLD_ENTRY, OLD),
        ("Advanced options for GNU/Linux>GNU/Linux, with Linux 6.1.0-50-amd64", OLD),
        ("gnulinux-no-such-entry", NEW),  # GRUB falls back to the first entry
        (None, NEW),
    ],
)
def test_a_default_names_an_entry_by_position_id_or_title(default: str, release: str) -> None:
    assert grub.resolve(menu("debian12-two-kernels.cfg")["entries"], default) == release


def _node(
    tmp_path: Path,
    cfg: str,
    hold: str | None = None,
    grubenv: str = "",
    built=(OLD,),
    site: dict[str, str] | None = None,
) -> dict:
    """kernels.read on a node with both kernels, the module for those `built`, and
    GRUB's menu; `site`: more of the site's settings files in grub.d, name to text."""
    boot = tmp_path / "boot"
    (boot / "grub").mkdir(parents=True)
    for release in (OLD, NEW):
        (boot / f"vmlinuz-{release}").write_bytes(b"")
    (boot / "grub" / "grub.cfg").write_text((FIXTURES / cfg).read_text())
    (boot / "grub" / "grubenv").write_text("# GRUB Environment Block\n" + grubenv)
    for release in built:
        module = tmp_path / "modules" / release / "updates" / "dkms" / "nvidia-current.ko"
        module.parent.mkdir(parents=True)
        module.write_bytes(b"\x7fELF")
    settings = tmp_path / "grub.d"
    settings.mkdir()
    (tmp_path / "grub").write_text("GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n")
    (settings / "50-cloudimg-settings.cfg").write_text("GRUB_TIMEOUT=0\n")
    if hold:
        (settings / "99-gpufleet-kernel.cfg").write_text(grub.hold_text(hold, OLD, "why"))
    for name, text in (site or {}).items():
        (settings / name).write_text(text)

    def run(argv: list[str]) -> tuple[int, str, str]:
        release = Path(argv[1]).parts[-4]
        return 0, f"version: 535.261.03\nvermagic: {release} SMP mod_unload\n", ""

    paths = {
        "BOOT_DIR": str(boot),
        "MODULES_DIR": str(tmp_path / "modules"),
        "GRUBENV_PATHS": (str(boot / "grub" / "grubenv"),),
        "DKMS_SOURCES": str(tmp_path / "src"),
        "GRUB_CFG_PATHS": (str(boot / "grub" / "grub.cfg"),),
        "GRUB_SETTINGS": str(tmp_path / "grub"),
        "GRUB_SETTINGS_DIR": str(settings),
        "BLS_ENTRIES_DIR": str(tmp_path / "no-bls-entries"),
        "GRUB_HOLD_FILE": str(settings / "99-gpufleet-kernel.cfg"),
    }
    facts = kernels.read(run, lambda name: f"/usr/sbin/{name}", paths)
    facts["running"] = "6.18.0-host"  # the test machine's kernel otherwise
    facts["modules"].pop(kernels.os.uname().release, None)
    facts["modules"]["6.18.0-host"] = None
    return facts


def test_the_menus_default_decides_and_a_newer_kernel_without_its_module_is_named(
    tmp_path: Path,
) -> None:
    facts = _node(tmp_path, "debian12-two-kernels.cfg")
    assert (facts["boot_next"], facts["boot_next_from"]) == (NEW, "grub.cfg default")
    assert facts["grub"]["held"] is None and facts["grub"]["unheld"] is None
    assert kernels.problems(facts, "535.261.03") == [
        f"kernel {NEW} is installed and would boot next, but has no nvidia module"
    ]
    # The running kernel has no image or entry here: the newest with a module is kept.
    assert kernels.fallback(facts, "535.261.03") == OLD
    assert kernels.fallback(facts, "550.163.01") is None  # no kernel has that driver


def test_a_one_time_choice_wins_over_the_menus_default(tmp_path: Path) -> None:
    facts = _node(tmp_path, "debian12-two-kernels.cfg", grubenv=f"next_entry={OLD_ENTRY}\n")
    assert (facts["boot_next"], facts["boot_next_from"]) == (OLD, "grub next_entry")


def test_a_hold_keeps_the_node_on_its_kernel_and_knows_what_it_holds_back(
    tmp_path: Path,
) -> None:
    facts = _node(tmp_path, "debian12-held.cfg", hold=OLD_ENTRY)
    assert (facts["boot_next"], facts["boot_next_from"]) == (OLD, "grub.cfg default")
    assert kernels.problems(facts, "535.261.03") == []
    assert (facts["grub"]["held"], facts["grub"]["unheld"]) == (OLD, NEW)
    # What the held-back kernel lacks is still said, as if it were to boot.
    assert kernels.problems(facts, "535.261.03", release=facts["grub"]["unheld"]) == [
        f"kernel {NEW} is installed and would boot next, but has no nvidia module"
    ]


def test_a_hold_written_but_not_yet_in_the_menu_does_not_count_as_done(tmp_path: Path) -> None:
    facts = _node(tmp_path, "debian12-two-kernels.cfg", hold=OLD_ENTRY)
    assert facts["boot_next"] == NEW  # update-grub has not run: GRUB still boots NEW
    assert facts["grub"]["held"] == OLD


def test_the_hold_file_says_why_and_sets_the_default() -> None:
    text = grub.hold_text(OLD_ENTRY, OLD, f"kernel {NEW} has no nvidia module")
    assert grub.setting([text]) == OLD_ENTRY
    assert f"# The node keeps booting {OLD}: kernel {NEW} has no nvidia module." in text


RECORD = {
    "components": {"driver": {"packages": {"nvidia-kernel-dkms": {"version": "535.261.03-1"}}}},
    "node": {"driver": {"version": "535.261.03", "module_type": "proprietary"}},
}


def test_a_hold_is_no_drift_until_the_kernel_held_back_has_its_module(tmp_path: Path) -> None:
    held = _node(tmp_path / "held", "debian12-held.cfg", hold=OLD_ENTRY)
    assert ns.kernel_drift(held, RECORD) == []  # the node is safe; nothing to repair yet
    built = _node(tmp_path / "built", "debian12-held.cfg", hold=OLD_ENTRY, built=(OLD, NEW))
    [entry] = ns.kernel_drift(built, RECORD)
    assert entry["name"] == NEW
    assert drift_summary(entry) == (
        f"kernel {NEW} has the driver's module now: the boot default gpufleet held on "
        f"{OLD} can be lifted"
    )


class _Module:
    """What boot_kernel's hold asks of AnsibleModule: where GRUB's tools are."""

    @staticmethod
    def get_bin_path(name: str) -> str | None:
        return "/usr/sbin/update-grub" if name == "update-grub" else None


def test_a_hold_is_offered_where_no_later_settings_file_sets_the_default(tmp_path: Path) -> None:
    # A later file that sets no default, or the same one, does not stand in the way.
    site = {"99z-site.cfg": "GRUB_TIMEOUT=2\n"}
    facts = _node(tmp_path, "debian12-two-kernels.cfg", site=site)
    assert facts["grub"]["read_after"] == {}
    found = boot_kernel._hold(_Module(), facts, "535.261.03", None)
    assert found["hold"]["release"] == OLD and found["hold_blocked"] is None


def test_a_settings_file_read_after_the_hold_that_sets_the_default_blocks_it(
    tmp_path: Path,
) -> None:
    """grub-mkconfig reads grub.d in name order and the last GRUB_DEFAULT wins: a
    site's file after gpufleet's would undo the hold. No hold is offered; the stop
    names the file (roles/driver/tasks/kernel.yml)."""
    site = {"99z-site.cfg": "GRUB_DEFAULT=0\n", "10-early.cfg": "GRUB_DEFAULT=saved\n"}
    facts = _node(tmp_path, "debian12-two-kernels.cfg", site=site)
    later = str(tmp_path / "grub.d" / "99z-site.cfg")
    assert facts["grub"]["read_after"] == {later: "0"}  # 10-early.cfg is read before
    found = boot_kernel._hold(_Module(), facts, "535.261.03", None)
    assert found["hold"] is None
    assert found["hold_blocked"] == (
        f"kernel {OLD} has the module, but GRUB_DEFAULT in {later}, read after "
        f"{tmp_path / 'grub.d' / '99-gpufleet-kernel.cfg'}, would override a hold on it"
    )
