# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Kernel updates held (driver_kernel_updates: held): which of a node's kernel packages
the driver stage holds, and which of those holds are gpufleet's own.

Held, no unattended upgrade, `apt upgrade` or `dnf update` brings a new kernel: on
Debian and Ubuntu the kernel image, headers and modules packages are held in dpkg (a
held metapackage, `linux-image-amd64` or `linux-image-generic`, keeps its new ABI's
package from arriving, and Ubuntu's `linux-generic` is kept back with it); on RHEL
the kernel packages are version-locked (dnf's versionlock plugin), which keeps new
kernel versions out of a transaction.

gpufleet remembers the holds it made (HOLDS_FILE, one package name a line) so that,
with the setting back at guarded, it releases those and leaves a hold the site made
itself before.
"""

from __future__ import annotations

import re

# Its path; roles/driver/vars/main.yml names the same file.
HOLDS_FILE = "/var/lib/gpufleet/kernel-holds"
_DPKG_LINE = re.compile(r"^([a-z])([a-zA-Z])\S*\s+(\S+)$")


def owned(text):
    """The package names in HOLDS_FILE's `text`, comments skipped; None without the
    file (`text` None)."""
    if text is None:
        return None
    names = []
    for line in (text or "").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and line not in names:
            names.append(line)
    return names


def installed_dpkg(listing):
    """{name: held} of the installed packages in `listing`, what
    `dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' PATTERN...` printed: the
    wanted state first (h: hold), then the current one (i: installed)."""
    found = {}
    for line in (listing or "").splitlines():
        match = _DPKG_LINE.match(line.strip())
        if match and match.group(2) == "i":
            found[match.group(3).split(":")[0]] = match.group(1) == "h"
    return found


def installed_rpm(listing, locked):
    """{name: held} of the installed packages in `listing`, what
    `rpm -q --qf '%{NAME}\\n' NAME...` printed ("package x is not installed" skipped),
    held where `locked` (the names dnf's versionlock.list locks) has them."""
    return {
        line.strip(): line.strip() in set(locked)
        for line in (listing or "").splitlines()
        if line.strip() and " " not in line.strip()
    }


def plan(packages, owned_before, exclude=()):
    """What the driver stage holds, from `packages` ({name: held}, the node's kernel
    packages) and `owned_before` (the names HOLDS_FILE lists): {hold: every kernel
    package but those in `exclude` (held by the driver's own set already), sorted;
    owned: of those, the ones gpufleet holds for itself: held by it before and still
    installed, or not held by anyone until now}."""
    skip = {str(name).partition("=")[0] for name in exclude}
    hold = sorted(name for name in packages if name not in skip)
    mine = set(owned_before)
    return {
        "hold": hold,
        "owned": [name for name in hold if name in mine or not packages[name]],
    }
