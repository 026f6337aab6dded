# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The k8s_manifests role run for real (render mode) on made-up nodes: a complete,
schema-valid manifest set, nothing rewritten on a second run, stale files removed
(dcgm-exporter's when no node runs it in cluster mode), and bad input refused before
the directory is touched."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import kubernetes_validate
import yaml
from test_k8s_manifests import host

from conftest import FIXTURES, PROJECT, run_ansible

PLAYBOOK = """
- name: Make up the nodes' facts and stage outcomes
  hosts: all
  connection: local
  gather_facts: false
  tasks:
    - name: Publish the made-up GPU facts
      fake_gpu_facts:
        facts: "{{{{ test_facts }}}}"
    - name: Publish the made-up stage outcomes
      ansible.builtin.set_fact:
        driver_stage: "{{{{ test_stages.driver_stage }}}}"
        toolkit_stage: "{{{{ test_stages.toolkit_stage }}}}"
        runtime_config_stage: "{{{{ test_stages.runtime_config_stage }}}}"
        validator_stage: "{{{{ test_stages.validator_stage }}}}"
        device_plugin_stage: "{{{{ test_stages.device_plugin_stage }}}}"
        exporter_stage: "{{{{ test_stages.exporter_stage }}}}"

- name: The cluster side
  ansible.builtin.import_playbook: {project}/playbooks/k8s_manifests.yml
"""


def render(tmp_path: Path, *flags: str, exporter_mode: str = "cluster", **variables):
    """Run the role in render mode on three made-up hosts whose exporter stage ran in
    `exporter_mode`; `flags` go to ansible-playbook (e.g. --check)."""
    play_dir = tmp_path / "play"
    if not play_dir.exists():
        play_dir.mkdir()
        shutil.copytree(FIXTURES / "library", play_dir / "library")
        (play_dir / "play.yml").write_text(PLAYBOOK.format(project=PROJECT))
    hosts = {}
    for hostvars in (
        host("gpu-h100", "h100-sxm-8"),
        host("gpu-t4", "t4-1", sharing="time-slicing", replicas=2),
        host("cpu-1", "none"),
    ):
        stages = {k: v for k, v in hostvars.items() if k.endswith("_stage")}
        stages["exporter_stage"] = {"status": "ready", "mode": exporter_mode}
        hosts[hostvars["inventory_hostname"]] = {
            "test_facts": hostvars["ansible_facts"]["gpufleet"],
            "test_stages": stages,
            "ansible_python_interpreter": sys.executable,
        }
    inventory = {"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}
    (play_dir / "hosts.yml").write_text(yaml.safe_dump(inventory))
    out = tmp_path / "out"
    extra = {"k8s_manifests_render_dir": str(out), **variables}
    rc, report = run_ansible(
        "ansible-playbook",
        "-i",
        str(play_dir / "hosts.yml"),
        str(play_dir / "play.yml"),
        "-e",
        json.dumps(extra),
        *flags,
    )
    return rc, report, out


def changed(report) -> int:
    return sum(stats.get("changed", 0) for stats in report["stats"].values())


def message(report) -> str:
    return json.dumps(report)


def test_render_writes_a_complete_valid_set_and_is_idempotent(tmp_path):
    rc, report, out = render(tmp_path)
    assert rc == 0, message(report)
    files = sorted(p.name for p in out.iterdir())
    kinds = [yaml.safe_load((out / f).read_text())["kind"] for f in files]
    assert kinds[0] == "Namespace"
    assert {"RuntimeClass", "ConfigMap", "DaemonSet", "Service", "ServiceMonitor"} <= set(kinds)
    assert kinds.count("Node") == 3
    for name in files:
        text = (out / name).read_text()
        assert text.startswith("# Rendered by gpufleet")
        document = yaml.safe_load(text)
        if document["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(document, "1.33.0", strict=True)
    t4 = yaml.safe_load(next(out.glob("*-node-gpu-t4.yaml")).read_text())
    assert t4["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "time-slicing-2"

    rc, report, _ = render(tmp_path)
    assert rc == 0, message(report)
    assert changed(report) == 0


def test_files_of_objects_no_longer_wanted_are_removed(tmp_path):
    rc, report, out = render(tmp_path)
    assert rc == 0, message(report)
    (out / "notes.yaml").write_text("kept: true\n")  # not ours: left alone
    rc, report, _ = render(tmp_path, k8s_manifests_exporter=False)
    assert rc == 0, message(report)
    names = {p.name for p in out.iterdir()}
    assert not any("dcgm-exporter" in name for name in names)
    assert "notes.yaml" in names
    assert any("daemonset-nvidia-device-plugin" in name for name in names)


def exporter_files(out: Path) -> list[str]:
    """The exporter's manifests in `out`, without their numbers (kind-name.yaml)."""
    return sorted(p.name.split("-", 1)[1] for p in out.iterdir() if "dcgm-exporter" in p.name)


def said(report) -> str:
    """What the run's tasks said (their messages), one per line."""
    return "\n".join(
        str(result.get("msg", ""))
        for play in report["plays"]
        for task in play["tasks"]
        for result in task["hosts"].values()
    )


def test_with_every_exporter_on_its_host_the_exporter_is_left_out_and_removed(tmp_path):
    """No node runs dcgm-exporter in cluster mode: its DaemonSet would be scheduled on
    no node, so the manifests of an earlier run are removed (check mode only says
    so), the run says why, and the next run changes nothing."""
    rc, report, out = render(tmp_path)
    assert rc == 0, message(report)
    exporter = [
        "daemonset-nvidia-dcgm-exporter.yaml",
        "service-nvidia-dcgm-exporter.yaml",
        "servicemonitor-nvidia-dcgm-exporter.yaml",
    ]
    assert exporter_files(out) == exporter

    rc, report, _ = render(tmp_path, "--check", exporter_mode="host")
    assert rc == 0, message(report)
    assert changed(report) > 0
    assert exporter_files(out) == exporter, "check mode removed a file"

    rc, report, _ = render(tmp_path, exporter_mode="host")
    assert rc == 0, message(report)
    assert exporter_files(out) == []
    assert any("daemonset-nvidia-device-plugin" in p.name for p in out.iterdir())
    assert "No GPU host runs dcgm-exporter in cluster mode" in said(report)
    node = yaml.safe_load(next(out.glob("*-node-gpu-t4.yaml")).read_text())
    assert node["metadata"]["labels"]["nvidia.com/gpu.deploy.dcgm-exporter"] == "pre-installed"

    rc, report, _ = render(tmp_path, exporter_mode="host")
    assert rc == 0, message(report)
    assert changed(report) == 0

    rc, report, _ = render(tmp_path)
    assert rc == 0, message(report)
    assert exporter_files(out) == exporter
    assert "No GPU host runs dcgm-exporter" not in said(report)


def test_bad_input_fails_before_anything_is_written(tmp_path):
    rc, report, out = render(
        tmp_path, k8s_manifests_dcgm_exporter_image="nvcr.io/nvidia/k8s/dcgm-exporter: 3.3.9"
    )
    assert rc != 0
    assert "k8s_manifests_dcgm_exporter_image" in message(report)
    assert not out.exists()
    rc, report, out = render(tmp_path, k8s_manifests_service_monitor="sometimes")
    assert rc != 0
    assert "k8s_manifests_service_monitor" in message(report)
    assert not out.exists()
