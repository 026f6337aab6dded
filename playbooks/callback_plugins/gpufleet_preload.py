# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Load once, in ansible-playbook's own process, the plugins nearly every task loads.

ansible-core runs each task on each host in a worker process it forks from
ansible-playbook. What the worker imports that ansible-playbook had not is imported
anew in every worker and lost when it exits: in a pass of site.yml that changes
nothing, the collection's filter plugins (every file of them, to find one filter by
name) were imported in 27 workers, ansible-core's test plugins (`is changed`,
`is skipped`) in 40, and what runs a module on a node in 36 to 44. This plugin, loaded
for every playbook of playbooks/ (and site.yml, which imports them) because it sits
next to them, loads them before the first task, so each worker finds them loaded:
the controller's CPU for such a pass over one node went from 7.6 to 6.9 s
(docs/verification.md). It changes no result: a plugin that cannot be loaded here is
loaded by the worker as before.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpufleet_preload
type: aggregate
short_description: loads the plugins most of gpufleet's tasks use before the first task
description:
  - Loads gpufleet.nvidia's filter plugins, ansible-core's test plugins and what runs a
    module on a node in ansible-playbook's own process, so the worker forked for each
    task does not import them again.
  - Loaded without being enabled, for the playbooks next to it only.
options: {}
"""

import contextlib
import importlib

from ansible.plugins.callback import CallbackBase

# Any filter of gpufleet.nvidia: finding one loads every filter file of the collection.
COLLECTION_FILTER = "gpufleet.nvidia.ready_for"
MODULES = (
    # The action plugin that sends a module to the node (the JSON profiles of its
    # arguments and result are loaded through ansible-core's own calls below).
    "ansible.plugins.action.normal",
    # The packages ansible-core resolves ansible.builtin's filters and tests through.
    "ansible_collections.ansible.builtin.plugins.filter",
    "ansible_collections.ansible.builtin.plugins.test",
)


def preload() -> None:
    from ansible.module_utils.common.json import Direction, get_module_decoder, get_module_encoder
    from ansible.plugins.loader import filter_loader, test_loader

    steps = [
        lambda: filter_loader.get(COLLECTION_FILTER),
        lambda: list(test_loader.all()),
        lambda: get_module_encoder("legacy", Direction.CONTROLLER_TO_MODULE),
        lambda: get_module_decoder("legacy", Direction.MODULE_TO_CONTROLLER),
        *(lambda name=name: importlib.import_module(name) for name in MODULES),
    ]
    for step in steps:
        with contextlib.suppress(Exception):  # the worker loads it as it would have
            step()


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet_preload"
    CALLBACK_NEEDS_ENABLED = False

    def v2_playbook_on_start(self, playbook) -> None:
        preload()
