# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's CPU cores as a scheduler numbers them, from sysfs.

Reads <sysfs_root>/devices/system/cpu/{online,cpuN/topology/{physical_package_id,
core_cpus_list}}. Cores get logical indexes as hwloc gives them on common layouts
(lstopo's "Core L#", which Slurm's gres.conf Cores= takes): packages in the order of
their first CPU, and within a package cores in the order of their first CPU. Linux
CPU ids can interleave packages (cpu0 on package 0, cpu1 on package 1), so the index
of a core is not its first CPU's id. Where ids interleave caches or groups inside a
package (some sub-NUMA clustering layouts), hwloc's tree order can differ from this;
the Slurm stage writes Cores= only where the count agrees with slurmd's.
"""

from __future__ import annotations

import os
import re

_CPU_DIR = re.compile(r"^cpu(\d+)$")


def parse_cpulist(text: str | None) -> list[int]:
    """CPU ids of a kernel cpulist ("0-3,8,10-11"); [] for an empty or unreadable one."""
    cpus: set[int] = set()
    for part in (text or "").strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            cpus.update(range(int(first), int(last or first) + 1))
        except ValueError:
            return []
    return sorted(cpus)


def read_sysfs(path: str) -> str | None:
    """A sysfs attribute's text, stripped (None when it cannot be read)."""
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def core_indexes(sysfs_root: str) -> dict[int, int]:
    """{CPU id: logical index of its core} of every CPU whose topology sysfs shows
    ({} when it shows none)."""
    base = os.path.join(sysfs_root, "devices", "system", "cpu")
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    online = set(parse_cpulist(read_sysfs(os.path.join(base, "online"))))
    cores: dict[tuple[str, tuple[int, ...]], None] = {}
    for name in names:
        match = _CPU_DIR.match(name)
        if not match or (online and int(match.group(1)) not in online):
            continue
        topology = os.path.join(base, name, "topology")
        package = read_sysfs(os.path.join(topology, "physical_package_id"))
        # core_cpus_list since Linux 5.7; thread_siblings_list before it.
        siblings = read_sysfs(os.path.join(topology, "core_cpus_list")) or read_sysfs(
            os.path.join(topology, "thread_siblings_list")
        )
        threads = parse_cpulist(siblings) or [int(match.group(1))]
        if package is not None:
            cores[(package, tuple(threads))] = None
    first_of_package: dict[str, int] = {}
    for package, threads in cores:
        first_of_package[package] = min(first_of_package.get(package, threads[0]), threads[0])
    ordered = sorted(cores, key=lambda core: (first_of_package[core[0]], core[1][0]))
    return {cpu: index for index, (_, threads) in enumerate(ordered) for cpu in threads}
