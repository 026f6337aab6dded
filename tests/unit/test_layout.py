# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Project-level promises: no default inventory, every stage playbook wired into site.yml."""

from __future__ import annotations

import configparser
import tomllib

import yaml

from conftest import PROJECT


def test_default_inventory_reaches_no_host():
    config = configparser.ConfigParser()
    config.read(PROJECT / "ansible.cfg")
    inventory = PROJECT / config["defaults"]["inventory"]
    assert yaml.safe_load(inventory.read_text()) == {"all": {"hosts": {}}}


# Playbooks the reconciler runs on their own, not in a converge pass: the drift check,
# the cordon/drain/uncordon steps of a rollout, and its Slurm drain and resume.
RUN_ON_THEIR_OWN = {
    "playbooks/probe.yml",
    "playbooks/remediate.yml",
    "playbooks/rollout.yml",
    "playbooks/slurm_drain.yml",
}


def test_site_imports_every_playbook():
    site = yaml.safe_load((PROJECT / "site.yml").read_text())
    imported = {entry["ansible.builtin.import_playbook"] for entry in site}
    on_disk = {f"playbooks/{p.name}" for p in (PROJECT / "playbooks").glob("*.yml")}
    assert imported == on_disk - RUN_ON_THEIR_OWN
    assert on_disk >= RUN_ON_THEIR_OWN


def test_python_dependencies_are_pinned_in_pyproject_only():

    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["dev"]
    assert requirements and all("==" in r for r in requirements), requirements
    assert not list(PROJECT.glob("requirements*.txt"))
