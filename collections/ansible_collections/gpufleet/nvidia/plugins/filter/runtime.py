# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a running container runtime reports about its runtimes, as filters.

These read the runtime's own view of its configuration (``containerd config dump``),
not our file: they tell whether the config we wrote is the one the runtime uses.
The documentation is in containerd_runtimes.yml next to this file.
"""

from __future__ import annotations

import re
import tomllib

from ansible.errors import AnsibleFilterError

# The CRI plugin whose runtimes kubelet uses, by containerd major version (a
# containerd 2.x dump is config version 3, or 4 from 2.3; a 1.x dump version 2).
_CRI_RUNTIMES_PLUGIN = {1: "io.containerd.grpc.v1.cri", 2: "io.containerd.cri.v1.runtime"}
_VERSION = re.compile(r"\bv?(\d+)\.(\d+)\.(\d+)")


def containerd_runtimes(dump, version_output):
    """The CRI runtimes a containerd daemon of this version reads from this dump."""
    found = _VERSION.search(version_output or "")
    if not found:
        raise AnsibleFilterError(f"no containerd version in {version_output!r}")
    major = int(found.group(1))
    plugin_name = _CRI_RUNTIMES_PLUGIN.get(major, _CRI_RUNTIMES_PLUGIN[2])
    try:
        config = tomllib.loads(dump)
    except tomllib.TOMLDecodeError as exc:
        raise AnsibleFilterError(f"containerd config dump is not TOML: {exc}") from exc
    plugin = config.get("plugins", {}).get(plugin_name, {})
    section = plugin.get("containerd", {})
    runtimes = {
        name: {
            "runtime_type": entry.get("runtime_type", ""),
            "binary": (entry.get("options") or {}).get("BinaryName", ""),
        }
        for name, entry in (section.get("runtimes") or {}).items()
    }
    return {
        "version": ".".join(found.groups()),
        "plugin": plugin_name,
        "default": section.get("default_runtime_name", ""),
        "runtimes": runtimes,
        # containerd 2.x has CDI on by default, and 2.4 no longer shows the key.
        "cdi": bool(plugin.get("enable_cdi", major >= 2)),
    }


class FilterModule:
    def filters(self):
        return {"containerd_runtimes": containerd_runtimes}
