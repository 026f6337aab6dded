# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet tool's pure parts: recipe hashing, node specs, generated inventories."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import yaml

import cluster
import fleet
import slurm


def test_image_tag_changes_when_the_kit_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(fleet, "PROJECT", tmp_path)
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "a.py").write_text("one")
    before = fleet.tree_hash([kit])
    assert fleet.tree_hash([kit]) == before
    (kit / "a.py").write_text("two")
    changed = fleet.tree_hash([kit])
    assert changed != before
    (kit / "__pycache__").mkdir()
    (kit / "__pycache__" / "a.pyc").write_text("ignored")
    assert fleet.tree_hash([kit]) == changed


def test_node_spec_parsing():
    assert fleet._parse_node("gpu1=t4-1") == fleet.NodeSpec("gpu1", "t4-1")
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=PROFILE"):
        fleet._parse_node("gpu1")


def test_written_inventory_is_read_back_by_ansible(tmp_path):
    specs = [
        fleet.NodeSpec("bench01", "t4-1"),
        fleet.NodeSpec("bench02", "none"),
        fleet.NodeSpec("bench03", "a100-pcie-2", "trixie"),
    ]
    path = tmp_path / "hosts.yml"
    fleet.write_inventory(specs, path)
    assert yaml.safe_load(path.read_text())["all"]["children"]["gpu_nodes"]["hosts"] == {
        "bench01": {"gpusim_profile": "t4-1"},
        "bench02": {"gpusim_profile": "none"},
        "bench03": {"gpusim_profile": "a100-pcie-2", "gpusim_release": "trixie"},
    }
    assert fleet.inventory_nodes(path) == specs


def test_default_inventory_lists_the_default_fleet_on_both_debian_releases():
    nodes = fleet.inventory_nodes(fleet.DEFAULT_INVENTORY)
    profiles = sorted((n.profile, n.release) for n in nodes)
    assert profiles == [
        ("a100-pcie-2", "trixie"),
        ("h100-sxm-8", "bookworm"),
        ("h100-sxm-8", "bookworm"),
        ("none", "bookworm"),
        ("t4-1", "bookworm"),
    ]


def test_a_node_names_its_debian_release_after_its_profile():
    parse = fleet._parse_node
    assert parse("gpu13=a100-pcie-2@trixie") == fleet.NodeSpec("gpu13", "a100-pcie-2", "trixie")
    assert parse("gpu12=t4-1") == fleet.NodeSpec("gpu12", "t4-1", "bookworm")
    with pytest.raises(argparse.ArgumentTypeError, match="release one of bookworm, trixie"):
        parse("gpu=t4-1@bullseye")
    assert fleet.image_tag("trixie") == fleet.image_tag() + "-trixie"


def test_fleet_cli_reports_errors_in_words(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(fleet.SIM_DIR / "fleet.py"),
            "up",
            "-i",
            str(tmp_path / "missing.yml"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("fleet: ")
    assert "Traceback" not in result.stderr


def test_a_node_is_not_started_as_a_copy_of_itself() -> None:
    with pytest.raises(fleet.FleetError, match="--copy-of b: the node copied cannot be one"):
        fleet.up([fleet.NodeSpec("a", "t4-1"), fleet.NodeSpec("b", "t4-1")], "mirror", "b")


def test_a_node_of_an_unknown_profile_is_refused_before_any_starts() -> None:
    # Before, it started and ran without a simulated PCI tree: every play on it failed.
    specs = [fleet.NodeSpec("a", "t4-1"), fleet.NodeSpec("b", "a100-2")]
    with pytest.raises(fleet.FleetError, match=r"unknown GPU profile: b=a100-2; known: .*t4-1"):
        fleet.up(specs, "mirror")
    assert "models" not in fleet.profiles() and "a100-pcie-2" in fleet.profiles()


def _fake_kubectl(directory, script: str):
    kubectl = directory / "kubectl"
    kubectl.write_text("#!/bin/sh\n" + script)
    kubectl.chmod(0o755)
    return directory


def test_waiting_for_a_condition_asks_again_while_the_object_has_none_yet(tmp_path):
    """kubectl wait fails at once on a CRD or Node whose status.conditions is still
    empty (as just after it was created); the fixture asks again until it is met."""
    calls = tmp_path / "calls"
    bin_dir = _fake_kubectl(
        tmp_path,
        f'echo "$@" >> {calls}\n'
        f'if [ "$(wc -l < {calls})" -lt 3 ]; then\n'
        '  echo "error: .status.conditions accessor error: <nil> is of the type <nil>, '
        'expected []interface{}" >&2; exit 1\nfi\n',
    )
    cluster.wait_for(bin_dir, "Established", "crd/x.example.com", timeout=10)
    lines = calls.read_text().splitlines()
    assert len(lines) == 3
    assert "wait --for=condition=Established" in lines[-1] and "crd/x.example.com" in lines[-1]


def test_waiting_for_a_condition_gives_up_on_any_other_error(tmp_path):
    bin_dir = _fake_kubectl(tmp_path, 'echo "error: timed out waiting" >&2; exit 1\n')
    with pytest.raises(cluster.ClusterError, match="timed out waiting"):
        cluster.wait_for(bin_dir, "Ready", "node/a", timeout=10)


def test_more_nodes_than_the_inotify_limit_lets_boot_are_refused(tmp_path):
    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    fleet.check_inotify(14, limit)
    needed = r"15 nodes need about 135 inotify instances.*is 128"
    with pytest.raises(fleet.FleetError, match=needed):
        fleet.check_inotify(15, limit)


def test_slurm_fixture_names_each_node_by_its_address():
    """Podman's network has no DNS and a node's /etc/hosts does not keep additions
    across a reboot: slurm.conf carries the addresses."""
    line = slurm.with_address(
        "NodeName=gpu1 NodeAddr=10.0.0.9 CPUs=2 RealMemory=100 Gres=gpu:tesla_t4:1", "10.88.0.5"
    )
    assert line == "NodeName=gpu1 NodeAddr=10.88.0.5 CPUs=2 RealMemory=100 Gres=gpu:tesla_t4:1"
    conf = slurm.slurm_conf("head", "10.88.0.2", [line]).splitlines()
    assert "SlurmctldHost=head(10.88.0.2)" in conf
    assert "GresTypes=gpu" in conf
    assert conf[-2:] == [line, "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP"]


@pytest.mark.parametrize(
    ("state", "registered"),
    [
        ("IDLE", True),
        ("IDLE+DRAIN", True),
        ("UNKNOWN+DRAIN+INVALID_REG", True),  # registered, and refused: counts as an answer
        ("UNKNOWN", False),
        ("IDLE*", False),  # not responding, as sinfo writes it
        ("IDLE+NOT_RESPONDING", False),  # as scontrol writes it
        ("absent", False),
    ],
)
def test_slurm_fixture_waits_for_a_registration(state, registered):
    assert slurm._registered(state) is registered
