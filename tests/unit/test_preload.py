# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet's playbooks load the plugins most tasks use once, in ansible-playbook's own
process (playbooks/callback_plugins/gpufleet_preload.py), run for real by
ansible-playbook: the worker forked for a task finds the collection's filters,
ansible-core's tests and what runs a module already imported, and the filters give
the same results as without the plugin. A lookup of the test's own, run in the
worker, reports what was imported there before the task templated anything else."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import PROJECT, local_inventory, run_site_playbook

PLAY = """
- name: A task that reads the worker's imports, then one that uses the plugins
  hosts: all
  gather_facts: false
  tasks:
    - name: What the worker had imported before its own templating
      ansible.builtin.debug:
        msg: "imported {{ lookup('imported') }}"
    - name: A filter of the collection and a test of ansible-core
      ansible.builtin.debug:
        msg: "ready {{ stages | gpufleet.nvidia.ready_for('mig') }} {{ 'ready' is match('rea') }}"
      vars:
        stages: {driver_stage: {status: ready}}
"""

LOOKUP = """
import json, sys
from ansible.plugins.lookup import LookupBase

WANTED = {
    "filters": "ansible_collections.gpufleet.nvidia.plugins.filter.summary",
    "tests": "ansible.plugins.test.core",
    "module_runs": "ansible.plugins.action.normal",
}

class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        names = list(sys.modules)
        return [json.dumps({k: any(n.startswith(v) for n in names) for k, v in WANTED.items()})]
"""


def _run(tmp_path: Path, with_plugin: bool) -> list[str]:
    """Each task's message, in order."""
    site = tmp_path / ("with" if with_plugin else "without")
    (site / "lookup_plugins").mkdir(parents=True)
    if with_plugin:
        (site / "callback_plugins").symlink_to(PROJECT / "playbooks" / "callback_plugins")
    (site / "lookup_plugins" / "imported.py").write_text(LOOKUP)
    (site / "play.yml").write_text(PLAY)
    local_inventory(site / "hosts.yml", "node")
    ran = run_site_playbook(
        site,
        ANSIBLE_COLLECTIONS_PATH=str(PROJECT / "collections"),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        GPUFLEET_MODULE_CACHE="off",
    )
    [play] = json.loads(ran.stdout)["plays"]
    return [task["hosts"]["node"]["msg"] for task in play["tasks"]]


def test_each_worker_finds_the_plugins_loaded_and_the_results_are_the_same(tmp_path):
    (imported, ready), (alone, ready_alone) = _run(tmp_path, True), _run(tmp_path, False)
    said = json.loads(imported.removeprefix("imported "))
    assert said == {"filters": True, "tests": True, "module_runs": True}, said
    # Without it each worker imports them itself (what the plugin saves).
    said = json.loads(alone.removeprefix("imported "))
    assert said == {"filters": False, "tests": False, "module_runs": False}, said
    assert ready == ready_alone == "ready True True"
