# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Boot loader entries (BLS) as RHEL 8 and later keep them, and gpufleet's hold of the
boot default there.

Each kernel has an entry file, /boot/loader/entries/<machine-id>-<release>.conf, whose
`linux` line names its image (`linux /vmlinuz-<release>`); GRUB's menu reads them at
boot time and lists none itself. With GRUB_DEFAULT=saved (RHEL's setting) GRUB boots
the entry the environment block's `saved_entry` names, which `grubby --set-default`
writes. As a kernel package installs, kernel-install's GRUB plugin makes the new
kernel the saved entry where /etc/sysconfig/kernel says UPDATEDEFAULT=yes (RHEL's
default), and leaves the saved entry alone otherwise.

A hold here is three things: the saved entry set to the kernel the node keeps booting
(grubby), UPDATEDEFAULT=no so that a kernel installed meanwhile does not take the
default back, and gpufleet's record of both (HOLD_FILE), which names the kernel held
back and the site's own UPDATEDEFAULT, put back when the hold is lifted.
"""

from __future__ import annotations

import os
import re

ENTRIES_DIR = "/boot/loader/entries"
SYSCONFIG_KERNEL = "/etc/sysconfig/kernel"
HOLD_FILE = "/var/lib/gpufleet/kernel-hold.conf"

_LINUX = re.compile(r"^\s*linux\s+\S*?/vmlinuz-(\S+)\s*$")
_ASSIGNMENT = re.compile(r"""^\s*([A-Z_]+)=["']?([^"'#]*?)["']?\s*(#.*)?$""")


def entries(entries_dir, read):
    """{release: entry id} of the boot loader entries in `entries_dir` (the id is the
    file's name without .conf); rescue entries, which boot a generic image, left out.
    `read(path)` gives a file's text, or None."""
    try:
        names = sorted(os.listdir(entries_dir))
    except OSError:
        return {}
    found = {}
    for name in names:
        if not name.endswith(".conf") or "rescue" in name:
            continue
        for line in (read(os.path.join(entries_dir, name)) or "").splitlines():
            match = _LINUX.match(line)
            if match:
                found.setdefault(match.group(1), name[: -len(".conf")])
                break
    return found


def assignments(text):
    """The NAME=value lines of a shell-style settings file (/etc/sysconfig/kernel,
    gpufleet's hold record); the last one of a name wins."""
    found = {}
    for line in (text or "").splitlines():
        match = _ASSIGNMENT.match(line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def facts(releases, entry_ids, record_text, sysconfig_text, grub_default):
    """The hold's side of kernels.read on a node that boots BLS entries: {held: the
    release gpufleet's record keeps booting (None without a record), unheld: the one
    the node would boot without the hold, held_back: the one the record held back,
    site_updatedefault: the site's UPDATEDEFAULT (from the record under a hold, as it
    was before it), updatedefault: the file's value now, saved: whether GRUB_DEFAULT is
    the saved entry, as a hold needs, entries: each release's entry id}."""
    record = assignments(record_text) if record_text is not None else {}
    now = assignments(sysconfig_text).get("UPDATEDEFAULT") if sysconfig_text is not None else None
    held, back = record.get("HELD") or None, record.get("HELD_BACK") or None
    site = record.get("SITE_UPDATEDEFAULT", now) if record else now
    unheld = None
    if held:
        # kernel-install would have made each kernel installed since the default.
        unheld = releases[-1] if site == "yes" else back if back in releases else held
    return {
        "held": held,
        "unheld": unheld,
        "held_back": back,
        "site_updatedefault": site,
        "updatedefault": now,
        "saved": grub_default == "saved",
        "entries": dict(entry_ids),
    }


def hold_text(release, held_back, site_updatedefault, reason):
    """gpufleet's record of a hold: the kernel kept, the one held back, and the
    site's UPDATEDEFAULT before the hold (empty: the file did not set it)."""
    return (
        "# Written by gpufleet (the driver stage), which also made the kernel below the boot\n"
        "# default (grubby) and set UPDATEDEFAULT=no in /etc/sysconfig/kernel where it was\n"
        "# yes; it undoes all three once the kernel held back has the driver's module. By\n"
        "# hand: UPDATEDEFAULT back to SITE_UPDATEDEFAULT, grubby --set-default the kernel\n"
        "# held back, and delete this file.\n"
        f"# The node keeps booting {release}: {reason}.\n"
        f"HELD={release}\n"
        f"HELD_BACK={held_back}\n"
        f"SITE_UPDATEDEFAULT={site_updatedefault or ''}\n"
    )
