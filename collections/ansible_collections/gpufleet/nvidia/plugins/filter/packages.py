# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""dpkg_query and dpkg_installed: whether dpkg has packages installed whole, as apt
names them, told without apt (which loads its whole cache to find nothing to do).
apt_offered: whether apt's lists offer a package at all. dpkg_foreign: which of the
files a role's packages would install are there already from another origin.

Documentation: dpkg_query.yml, dpkg_installed.yml, apt_offered.yml and dpkg_foreign.yml
next to this file.
"""

from __future__ import annotations

from ansible_collections.gpufleet.nvidia.plugins.module_utils.lazy import LazyModule

apt_set = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.apt_set")

_FORMAT = "${Package} ${db:Status-Abbrev}${Version}\\n"


def dpkg_query(names):
    """The command that lists `names` (apt's `name` or `name=version`) for
    dpkg_installed."""
    return ["dpkg-query", "--show", f"--showformat={_FORMAT}"] + [
        str(name).partition("=")[0] for name in names
    ]


def dpkg_installed(listing, names):
    """True when every package of `names` (apt's `name` or `name=version`) is in
    `listing` installed whole, at exactly the version given where one is.
    `listing` is what the command of dpkg_query printed for them."""
    found = {}
    for line in (listing or "").splitlines():
        package, _, rest = line.partition(" ")
        status, version = rest[:3], rest[3:]
        found.setdefault(package, []).append(version if status in apt_set.WHOLE else None)
    for name in names:
        package, _, version = str(name).partition("=")
        versions = found.get(package.split(":")[0])
        if not versions or None in versions or (version and set(versions) != {version}):
            return False
    return bool(names)


def apt_offered(policy, name):
    """True when `policy` (what `apt-cache policy NAME` printed) names a candidate
    version of `name`: one apt would install. False where apt does not know the
    package (its lists were never fetched) or every version is pinned away."""
    return bool((apt_set.parse_policy(policy or "").get(str(name)) or {}).get("candidate"))


def dpkg_foreign(search, programs, present):
    """{path: [package, ...]} of the files of `present` that the package `programs`
    names for them ({path: apt's `name` or `name=version`}) does not own, with the
    packages that do (none: no package owns the file), from what
    `dpkg-query --search PATH...` printed for them. Diversions own nothing."""
    owners = {}
    for line in (search or "").splitlines():
        names, found, path = line.partition(": ")
        if found and not names.startswith("diversion by "):
            packages = (name.strip().split(":")[0] for name in names.split(","))
            owners.setdefault(path.strip(), []).extend(packages)
    return {
        path: owners.get(path, [])
        for path in present
        if str(programs.get(path, "")).partition("=")[0] not in owners.get(path, [])
    }


class FilterModule:
    def filters(self):
        return {
            "dpkg_query": dpkg_query,
            "dpkg_installed": dpkg_installed,
            "apt_offered": apt_offered,
            "dpkg_foreign": dpkg_foreign,
        }
