# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""inventories/example, the production-shaped example a site starts from: every
setting in it passes the settings pass (as site.yml's first play runs it, no node
contacted), its pools' rollout policies read, and its servers outside gpu_nodes are
in no play and not read by the reconciler."""

from __future__ import annotations

from pathlib import Path

from conftest import PROJECT, run_ansible
from runner.engine import AnsibleEngine
from runner.rollout import RolloutPolicy, policies

EXAMPLE = PROJECT / "inventories" / "example"
MANAGED = {
    "hgx-r01-n01",
    "hgx-r01-n02",
    "a100-r02-n01",
    "a100-r02-n02",
    "t4-r03-n01",
    "login-01",
}


def test_every_setting_of_the_example_passes_the_settings_pass():
    playbook = str(PROJECT / "playbooks" / "settings.yml")
    rc, report = run_ansible("ansible-playbook", "-i", str(EXAMPLE), playbook)
    outcome = report["plays"][0]["tasks"][0]["hosts"]
    assert rc == 0, {h: r.get("msg") for h, r in outcome.items() if r.get("failed")}
    assert set(outcome) == MANAGED, "www-01, www-02 and db-01 are in no play"


def test_the_reconciler_reads_the_managed_hosts_and_their_pools(tmp_path: Path):
    hostvars = AnsibleEngine(PROJECT, str(EXAMPLE), tmp_path).inventory()
    assert set(hostvars) == MANAGED
    found = policies(hostvars, RolloutPolicy())
    assert set(found) == {"hgx-training", "slurm-a100", "inference", "general"}
    assert (found["hgx-training"].max_unavailable, found["hgx-training"].pause) == (2, 600.0)
    assert found["inference"] == RolloutPolicy(pause=600.0)
