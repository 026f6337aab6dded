# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A module of the collection imported when one of its names is first used.

For the collection's filter plugins. To find `gpufleet.nvidia.<filter>`, Ansible loads
the collection's filter files in name order until one of them has it, in each worker
process it forks for a task on a host; what a file imports from module_utils comes
through Ansible's collection loader, which compiles it from source every time (it
keeps no bytecode). A filter file whose helpers are imported at its top makes them
paid for by every task that uses a filter of its own or of a file after it by name;
with `LazyModule`, a worker pays only for the helpers of the filters it calls.
"""

from __future__ import annotations

import importlib


class LazyModule:
    """Stands for the module `name` until an attribute of it is read."""

    def __init__(self, name):
        self._name = name
        self._module = None

    def __getattr__(self, attribute):
        # Only names the instance does not have come here (not _name, _module).
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)

    def __repr__(self):
        return f"<module {self._name}, imported on first use>"
