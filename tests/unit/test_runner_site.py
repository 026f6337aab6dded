# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The site's Ansible under the runner: its ansible.cfg governs the runs (found as
Ansible finds it), gpufleet only adds where its roles and collection are, and the
options sites use unattended reach every run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from conftest import PROJECT
from runner import site
from runner.arguments import build_parser
from runner.engine import AnsibleEngine, EngineError


@pytest.fixture
def site_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site's working directory, with no ANSIBLE_* of the test run's and a home of
    its own (no ~/.ansible.cfg)."""
    for name in [n for n in os.environ if n.startswith("ANSIBLE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "site"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def _system_config() -> str | None:
    system = Path("/etc/ansible/ansible.cfg")
    return str(system) if system.is_file() else None


def test_a_site_without_ansible_cfg_gets_gpufleets(site_dir: Path):
    expected = _system_config() or str(PROJECT / "ansible.cfg")
    assert site.config_environment(PROJECT)["ANSIBLE_CONFIG"] == expected


def test_the_sites_ansible_cfg_governs_with_gpufleets_paths_added(site_dir: Path):
    (site_dir / "ansible.cfg").write_text(
        "[defaults]\nroles_path = site-roles\ncollections_path = ~/collections\n"
    )
    env = site.config_environment(PROJECT)
    assert env["ANSIBLE_CONFIG"] == str(site_dir / "ansible.cfg")
    home = Path.home()
    # gpufleet's first: a site role named like one of its stages does not replace it.
    assert env["ANSIBLE_ROLES_PATH"].split(":") == [
        str(PROJECT / "roles"),
        str(site_dir / "site-roles"),
    ]
    assert env["ANSIBLE_COLLECTIONS_PATH"].split(":") == [
        str(PROJECT / "collections"),
        str(home / "collections"),
    ]


def _local_inventory(directory: Path) -> Path:
    inventory = directory / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"gpu_nodes": {"hosts": {"gpu-1": local}}}))
    return inventory


def _engine(args: list[str], inventory: Path, work: Path) -> AnsibleEngine:
    parsed = build_parser().parse_args(["plan", "-i", str(inventory), *args])
    options, vault = site.passed_through(parsed)
    return AnsibleEngine(PROJECT, str(inventory), work, options=options, vault_options=vault)


def test_a_run_follows_the_sites_config_and_takes_its_extra_vars(site_dir: Path):
    """A real run (the settings pass, on this host): Ansible logs where the site's
    ansible.cfg says, and a variable given with -e @FILE (a relative path: the run
    starts elsewhere) reaches the run."""
    (site_dir / "ansible.cfg").write_text("[defaults]\nlog_path = ansible.log\n")
    (site_dir / "extra.yml").write_text("exporter_port: 99999\n")
    engine = _engine(["-e", "@extra.yml"], _local_inventory(site_dir), site_dir / "work")
    refused = engine.check_settings(["gpu-1"])
    assert "exporter_port" in refused["gpu-1"], refused
    log = (site_dir / "ansible.log").read_text()
    assert "Check every stage's settings on every node before any change" in log


def test_extra_vars_are_part_of_every_hosts_desired_state(site_dir: Path):
    inventory = _local_inventory(site_dir)
    (site_dir / "extra.yml").write_text("driver_branch: '550'\n")
    values = {"gpu-1": {"driver_branch": "535"}}
    plain = _engine([], inventory, site_dir / "w").desired_hashes(values)
    extra = _engine(["-e", "@extra.yml"], inventory, site_dir / "w")
    first = extra.desired_hashes(values)
    assert first != plain
    (site_dir / "extra.yml").write_text("driver_branch: '570'\n")
    assert extra.desired_hashes(values) != first, "the file is read again"
    assert _engine(["-e", "x=1"], inventory, site_dir / "w").desired_hashes(values) not in (
        plain,
        first,
    )


def test_the_options_pass_through_with_absolute_paths(site_dir: Path):
    parsed = build_parser().parse_args(
        [
            "reconcile",
            "-i",
            "hosts.yml",
            "-e",
            "@vars/site.yml",
            "-e",
            '{"exporter_port": 9401}',
            "--vault-id",
            "prod@vault-pass",
            "--vault-password-file",
            "~/pass",
            "--private-key",
            "keys/id_ed25519",
            "-u",
            "ops",
            "-b",
        ]
    )
    options, vault = site.passed_through(parsed)
    home = Path.home()
    assert vault == [
        "--vault-id",
        f"prod@{site_dir / 'vault-pass'}",
        "--vault-password-file",
        str(home / "pass"),
    ]
    assert options == [
        "--extra-vars",
        f"@{site_dir / 'vars/site.yml'}",
        "--extra-vars",
        '{"exporter_port": 9401}',
        *vault,
        "--private-key",
        str(site_dir / "keys/id_ed25519"),
        "--user",
        "ops",
        "--become",
    ]


def test_a_vault_prompt_is_refused_nobody_answers_it(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["plan", "-i", "h.yml", "--vault-id", "prod@prompt"])
    assert exit_.value.code == 2
    assert "the runner runs unattended, nobody can answer a prompt" in capsys.readouterr().err


def test_a_vaulted_inventory_is_read_with_the_sites_vault_password(site_dir: Path):
    """group_vars encrypted with ansible-vault: without the site's password the
    inventory cannot be read (a clear error); with --vault-password-file it is, by
    ansible-inventory (the in-process reader has no vault secrets)."""
    import subprocess

    _local_inventory(site_dir)
    (site_dir / "group_vars").mkdir()
    secret = site_dir / "group_vars" / "gpu_nodes.yml"
    secret.write_text("exporter_port: 9411\n")
    (site_dir / "vault-pass").write_text("correct horse\n")
    vault = Path(sys.executable).parent / "ansible-vault"
    subprocess.run(
        [str(vault), "encrypt", "--vault-password-file", "vault-pass", str(secret)],
        check=True,
        capture_output=True,
    )
    assert secret.read_text().startswith("$ANSIBLE_VAULT;")
    with pytest.raises(EngineError, match="cannot be read"):
        _engine([], site_dir, site_dir / "w").inventory()
    hostvars = _engine(
        ["--vault-password-file", "vault-pass"], site_dir, site_dir / "w"
    ).inventory()
    assert hostvars["gpu-1"]["exporter_port"] == 9411


def test_runs_start_where_the_runner_was_started(site_dir: Path, monkeypatch):
    """A relative path in the site's environment (or inventory) means what it means to
    the site's own Ansible runs: from the site's directory, not gpufleet's."""
    (site_dir / "logs").mkdir()
    monkeypatch.setenv("ANSIBLE_LOG_PATH", "logs/gpufleet.log")
    engine = _engine([], _local_inventory(site_dir), site_dir / "work")
    assert engine.check_settings(["gpu-1"]) == {}
    assert "Check every stage's settings" in (site_dir / "logs" / "gpufleet.log").read_text()
