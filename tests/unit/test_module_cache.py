# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet's playbooks keep the modules ansible-core packs between runs
(playbooks/callback_plugins/gpufleet_module_cache.py), run for real by ansible-playbook:
a second run packs none of the modules the first packed; a playbook's own library
module is packed anew each run; a module edited between runs runs as edited, from a
store of its own; and a store that cannot be used fails no run. Whether ansible-core
packed a module is read from its own debug lines, so an ansible-core whose cache works
otherwise fails here rather than going unnoticed."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from conftest import PROJECT, local_inventory, run_site_playbook

PLAY = """
- name: Modules from ansible-core, from a collection and from the playbook's library
  hosts: all
  gather_facts: false
  tasks:
    - name: A module of ansible-core
      ansible.builtin.command: "true"
      changed_when: false
    - name: A module of a collection
      tests.cache.say: {}
      register: said
    - name: A module of the playbook's own library
      say_local: {}
    - name: What the collection's module said
      ansible.builtin.debug:
        msg: "said {{ said.word }}"
"""

MODULE = """#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule
AnsibleModule(argument_spec={}).exit_json(changed=False, word=%r)
"""


def _site(tmp_path: Path) -> Path:
    """A playbook with the plugin next to it (as playbooks/ has it), a collection of its
    own and a library module."""
    site = tmp_path / "site"
    (site / "library").mkdir(parents=True)
    (site / "callback_plugins").symlink_to(PROJECT / "playbooks" / "callback_plugins")
    (site / "play.yml").write_text(PLAY)
    (site / "library" / "say_local.py").write_text(MODULE % "local")
    modules = tmp_path / "collections" / "ansible_collections" / "tests" / "cache" / "plugins"
    (modules / "modules").mkdir(parents=True)
    (modules / "modules" / "say.py").write_text(MODULE % "first")
    local_inventory(site / "hosts.yml", "node")
    return site


def _run(site: Path, store: str) -> subprocess.CompletedProcess[str]:
    return run_site_playbook(
        site,
        ANSIBLE_COLLECTIONS_PATH=str(site.parent / "collections"),
        ANSIBLE_DEBUG="1",
        GPUFLEET_MODULE_CACHE=store,
    )


def _packed(run: subprocess.CompletedProcess[str]) -> set[str]:
    """The modules the run packed itself: ansible-core's debug lines name the pack's
    file when they take its lock, then say whether they create it (one host, one task
    at a time, so the lines do not interleave)."""
    packed, locked = set(), ""
    for line in (run.stdout + run.stderr).splitlines():
        if "ANSIBALLZ: Lock acquired: " in line:
            locked = line.rsplit("/", 1)[-1].split("-ZIP_")[0]
        elif "ANSIBALLZ: Creating module" in line:
            packed.add(locked)
    return packed


def _said(run: subprocess.CompletedProcess[str]) -> str:
    said = re.search(r"msg: said (\w+)", run.stdout)
    assert said, run.stdout[-2000:]
    return said.group(1)


CORE = "ansible.modules.command"
OURS = "ansible_collections.tests.cache.plugins.modules.say"


def test_a_second_run_packs_none_of_the_modules_the_first_packed(tmp_path):
    site, root = _site(tmp_path), tmp_path / "store"
    # Stores of other sources: one unused for a day (removed), one used lately (kept).
    stale, recent = root / ("0" * 20), root / ("1" * 20)
    for directory in (stale, recent):
        directory.mkdir(parents=True)
    day_ago = time.time() - 25 * 3600
    os.utime(stale, (day_ago, day_ago))
    first = _run(site, str(root))
    assert {CORE, OURS, "ansible.legacy.say_local"} <= _packed(first), first.stdout[-2000:]
    assert not stale.exists() and recent.exists()
    (kept,) = (p for p in root.iterdir() if p != recent)
    assert kept.stat().st_mode & 0o777 == 0o700
    names = {p.name.split("-ZIP_")[0] for p in kept.iterdir()}
    assert {CORE, OURS} <= names and not any("say_local" in n for n in names), names
    second = _run(site, str(root))
    assert CORE not in _packed(second) and OURS not in _packed(second), second.stdout[-2000:]
    # The library module is not told apart from another of its name: packed each time.
    assert "ansible.legacy.say_local" in _packed(second)
    assert _said(second) == "first"


def test_a_module_edited_between_runs_runs_as_edited(tmp_path):
    site, store = _site(tmp_path), tmp_path / "store"
    assert _said(_run(site, str(store))) == "first"
    say = tmp_path / "collections/ansible_collections/tests/cache/plugins/modules/say.py"
    say.write_text(MODULE % "edited")
    edited = _run(site, str(store))
    assert _said(edited) == "edited"
    assert OURS in _packed(edited)
    assert len(list(store.iterdir())) == 2, "each version of the sources has its own store"
    # Edited again as a copy that keeps the size and the mtime would leave it.
    before = say.stat()
    say.write_text(MODULE % "copied")
    os.utime(say, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (say.stat().st_size, say.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert _said(_run(site, str(store))) == "copied"


def test_a_store_that_is_off_unusable_or_shared_is_not_used_and_fails_no_run(tmp_path):
    site = _site(tmp_path)
    assert {CORE, OURS} <= _packed(_run(site, "off"))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory\n")
    assert _said(_run(site, str(blocked / "store"))) == "first"
    # ansible-core loads a pack with pickle: a pack another user could have put in the
    # store would run as the controller's user.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert {CORE, OURS} <= _packed(_run(site, str(shared)))
    assert list(shared.iterdir()) == [], "nothing kept in a store others may write to"
