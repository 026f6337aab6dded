# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GRUB's menu as grub-mkconfig writes it, and gpufleet's hold of the boot default.

The menu (grub.cfg) is what GRUB runs: its entries, each booting one kernel image
(`linux /boot/vmlinuz-<release>` or, with a separate /boot, `linux /vmlinuz-<release>`),
nested in submenus, and the `default` it sets. A default is an entry's position, id or
title, one per level joined by '>' ("gnulinux-advanced-<uuid>>gnulinux-<release>-
advanced-<uuid>"), or the saved entry of GRUB's environment block (GRUB_DEFAULT=saved);
a default GRUB cannot find boots the first entry.

RHEL's menus list no kernels (their blscfg command reads /boot/loader/entries at boot
time): `entries` is empty there and the kernel is found from the saved entry instead
(kernels.boot_next).

A hold is a file of gpufleet's in /etc/default/grub.d, read by grub-mkconfig after
/etc/default/grub and the files before it, whose GRUB_DEFAULT names the entry of the
kernel the node keeps booting; update-grub makes it the menu's default.
"""

from __future__ import annotations

import re

CONFIG_PATHS = ("/boot/grub/grub.cfg", "/boot/grub2/grub.cfg")
SETTINGS = "/etc/default/grub"
SETTINGS_DIR = "/etc/default/grub.d"
HOLD_FILE = SETTINGS_DIR + "/99-gpufleet-kernel.cfg"

_BLOCK = re.compile(r"^\s*(menuentry|submenu)\s+(['\"])(.*?)\2(.*)\{\s*$")
_ID = re.compile(r"""(?:--id|\$menuentry_id_option)\s+(['"])(.*?)\1""")
_LINUX = re.compile(r"^\s*linux(?:efi|16)?\s+\S*?/vmlinuz-(\S+)")
_DEFAULT = re.compile(r"""^\s*set\s+default=(['"]?)(.*?)\1\s*$""")
_SETTING = re.compile(r"\s*GRUB_DEFAULT=(.*)$")


def parse_cfg(text):
    """{"default": the default the menu sets (None when it sets none), "entries": the
    menu, each entry {title, id, release, entries} (release: the kernel a menuentry
    boots, None for a submenu or another system; entries: a submenu's)}."""
    top = []
    stack = [top]  # the open blocks' entry lists; None for braces that are not entries
    default = None
    for line in (text or "").splitlines():
        block = _BLOCK.match(line)
        if block:
            ident = _ID.search(block.group(4))
            entry = {
                "title": block.group(3),
                "id": ident.group(2) if ident else None,
                "release": None,
                "entries": [] if block.group(1) == "submenu" else None,
            }
            _innermost(stack).append(entry)
            stack.append(entry["entries"] if entry["entries"] is not None else entry)
            continue
        if line.rstrip().endswith("{"):
            stack.append(None)
            continue
        if line.strip() == "}" and len(stack) > 1:
            stack.pop()
            continue
        kernel = _LINUX.match(line)
        if kernel and isinstance(stack[-1], dict) and not stack[-1]["release"]:
            stack[-1]["release"] = kernel.group(1)
        setting = _DEFAULT.match(line)
        if setting and setting.group(2) != "${next_entry}":
            default = setting.group(2)
    return {"default": default, "entries": top}


def _innermost(stack):
    for frame in reversed(stack):
        if isinstance(frame, list):
            return frame
    return stack[0]


def releases(entries):
    """Every release the menu boots, in menu order."""
    found = []
    for entry in entries:
        if entry["release"]:
            found.append(entry["release"])
        found.extend(releases(entry["entries"] or []))
    return found


def resolve(entries, default):
    """The release GRUB boots for the default `default` (as the menu's `set default`
    gives it, saved entries substituted): the entry it names, else the first entry; None
    when that entry boots no kernel image GRUB's menu names."""
    entry = _find(entries, default) if default else None
    if entry is None:
        entry = entries[0] if entries else None
        while entry is not None and entry["entries"]:
            entry = entry["entries"][0]
    return entry["release"] if entry else None


def _find(entries, default):
    level = entries
    entry = None
    for part in default.split(">"):
        if level is None:
            return None
        entry = next(
            (e for i, e in enumerate(level) if part in (str(i), e["id"], e["title"])), None
        )
        if entry is None:
            return None
        level = entry["entries"]
    # A submenu named alone boots its first entry.
    while entry["entries"]:
        entry = entry["entries"][0]
    return entry


def entry_path(entries, release):
    """The '>'-joined ids (titles where an entry has no id) of the first entry booting
    `release` that is not a recovery entry, as GRUB_DEFAULT names it; None without one."""
    for entry in entries:
        name = entry["id"] or entry["title"]
        if entry["entries"]:
            inner = entry_path(entry["entries"], release)
            if inner:
                return f"{name}>{inner}"
        elif entry["release"] == release and "recovery" not in name.lower():
            return name
    return None


def setting(texts):
    """GRUB_DEFAULT from settings files read in order (the last setting wins), or None."""
    value = None
    for text in texts:
        for line in (text or "").splitlines():
            match = _SETTING.match(line)
            if match:
                value = match.group(1).strip().strip("\"'")
    return value


def read_after(settings, hold_file):
    """{path: GRUB_DEFAULT} of the settings files grub-mkconfig reads after the hold
    file (those of its directory that sort after its name) and that set the default:
    whatever they say wins over the hold. `settings` maps paths to text, in read order."""
    directory = hold_file.rsplit("/", 1)[0] + "/"
    found = {}
    for path, text in settings.items():
        if path.startswith(directory) and path > hold_file:
            value = setting([text])
            if value is not None:
                found[path] = value
    return found


def hold_text(path, release, reason):
    """The hold file's content: GRUB_DEFAULT naming `path` (entry_path's), and why."""
    return (
        "# Written by gpufleet (the driver stage); removed by it once the kernel it holds\n"
        "# back has the driver's module. Delete it and run update-grub to undo by hand.\n"
        f"# The node keeps booting {release}: {reason}.\n"
        f'GRUB_DEFAULT="{path}"\n'
    )
