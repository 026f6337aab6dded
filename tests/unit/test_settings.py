# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The settings rules: the forms argument specs cannot say, checked before any change.

`settings.check` is the one place; the `settings_check` action runs it with each role's
argument spec, first in site.yml for every stage (and in the reconciler's settings
pass) and again in each role. That every variable is judged there is
test_settings_coverage's.
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.module_utils import settings
from conftest import PROJECT, run_ansible
from runner.engine import AnsibleEngine

ROLES = sorted(p.parent.parent.name for p in PROJECT.glob("roles/*/meta/argument_specs.yml"))


def _options(role):
    spec = yaml.safe_load((PROJECT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"]


def _defaults(role):
    return yaml.safe_load((PROJECT / "roles" / role / "defaults" / "main.yml").read_text()) or {}


def _check(role, **values):
    return settings.check(_options(role), values, str(PROJECT / "roles" / role))


# The shapes of a site's module-signing key and certificate (bodies cut short).
KEY = {
    "driver_secure_boot_signing_key": "-----BEGIN PRIVATE KEY-----\nMIIEvQ==\n"
    "-----END PRIVATE KEY-----\n"
}
CERTIFICATE = {
    "driver_secure_boot_signing_certificate": "-----BEGIN CERTIFICATE-----\nMIIDEz==\n"
    "-----END CERTIFICATE-----\n"
}


@pytest.mark.parametrize(
    ("values", "words"),
    [
        # The values a new user tried (issue 18), each refused with its variable named.
        ({"toolkit_version": "1.17.8-1; reboot"}, "toolkit_version: expected a toolkit version"),
        (
            {"driver_reboot_timeout": -5},
            "driver_reboot_timeout: expected a whole number of seconds",
        ),
        (
            {"driver_cuda_repo_base_url": "not a url; rm -rf /"},
            "driver_cuda_repo_base_url: expected an http(s)://",
        ),
        ({"driver_debian_mirror": "ftp://mirror example/debian"}, "driver_debian_mirror: expected"),
        (
            {"driver_debian_mirror": "http://mirror example/debian"},
            "driver_debian_mirror: expected",
        ),
        ({"driver_debian_mirror": "https:///debian"}, "driver_debian_mirror: expected"),
        # A key id is not a fingerprint; an empty list would trust nothing.
        (
            {"toolkit_repo_key_fingerprints": ["3bf863cc"]},
            "toolkit_repo_key_fingerprints: expected a non-empty list of OpenPGP",
        ),
        ({"exporter_repo_key_fingerprints": []}, "exporter_repo_key_fingerprints: expected"),
        ({"mig_manager_package_checksum": "md5:abc"}, "mig_manager_package_checksum: expected"),
        ({"mig_manager_version": "0.10.0-1"}, 'a mig-parted release such as "0.10.0"'),
        ({"driver_debian_mirror": "http://host:port/debian"}, "driver_debian_mirror: expected"),
        (
            {"k8s_manifests_namespace": "GPU Fleet"},
            "k8s_manifests_namespace: expected a Kubernetes namespace",
        ),
        ({"k8s_manifests_namespace": "a" * 64}, "k8s_manifests_namespace"),
        (
            {"k8s_manifests_tolerations": [{"key": "nvidia.com/gpu", "effect": "Sometimes"}]},
            "k8s_manifests_tolerations[0]: effect must be one of NoSchedule",
        ),
        (
            {
                "k8s_manifests_tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}
                ]
            },
            "operator Exists takes no value",
        ),
        (
            {"k8s_manifests_tolerations": [{"operator": "Equal"}]},
            "an empty key goes with operator Exists",
        ),
        (
            {"k8s_manifests_tolerations": [{"key": "a b"}]},
            "k8s_manifests_tolerations[0]: key and value",
        ),
        (
            {"k8s_manifests_tolerations": [{"key": "k", "tolerationSeconds": 5}]},
            "goes with effect NoExecute",
        ),
        (
            {"k8s_manifests_tolerations": [{"key": "k", "effects": "NoSchedule"}]},
            "unknown field effects",
        ),
        (
            {"k8s_manifests_tolerations": ["nvidia.com/gpu"]},
            "k8s_manifests_tolerations[0]: not a mapping",
        ),
        ({"k8s_manifests_exporter_scrape_interval": "30 seconds"}, "a Prometheus duration"),
        ({"k8s_manifests_runbook_url": "https://wiki/x#top"}, "without a #fragment"),
        ({"k8s_manifests_exporter_job": "dcgm\\d"}, "without quotes or backslashes"),
        ({"k8s_manifests_alert_rules_labels": {"release": 1}}, "quote numbers and booleans"),
        ({"k8s_manifests_monitoring_namespace": "Monitoring"}, "a Kubernetes namespace name"),
        ({"k8s_manifests_device_plugin_image": "nvcr.io/nvidia/Plugin:v1"}, "an image reference"),
        ({"k8s_manifests_field_manager": "gpu fleet"}, "k8s_manifests_field_manager"),
        ({"k8s_manifests_wait_timeout": 0}, "k8s_manifests_wait_timeout"),
        ({"exporter_port": 0}, "exporter_port: expected a TCP port"),
        ({"exporter_hostengine_address": "localhost"}, "host:port of DCGM's host engine"),
        (
            {"exporter_version": "3.3.9 latest"},
            "exporter_version: expected a Debian package version",
        ),
        (
            {"mig_gpu_consumers": ["dcgm exporter"]},
            "mig_gpu_consumers: expected systemd unit names",
        ),
        ({"exporter_repo_apt_selector": "o=NVIDIA"}, 'apt_preferences "Pin:" value'),
        ({"mig_config_file": "mig.yaml"}, "mig_config_file: expected an absolute path"),
        ({"toolkit_cdi_spec_path": "/etc/cdi/nvidia.txt"}, "ending in .yaml or .json"),
        ({"runtime_config_config_paths": {"podman": "/etc/x"}}, "keys among containerd"),
        ({"runtime_config_services": {"docker": "docker service"}}, "systemd unit names as values"),
        (
            {"validator_runtime_path": "/usr/bin/$(reboot)"},
            "validator_runtime_path: expected an absolute",
        ),
        ({"device_plugin_host_binary_checksum": "md5:abc"}, "sha256:<64 hex digits>"),
        (
            {
                "device_plugin_mode": "host",
                "device_plugin_host_binary_url": "https://example.com/p",
            },
            "device_plugin_host_binary_checksum: device_plugin_mode is host",
        ),
        (
            {"device_plugin_sharing": "none", "device_plugin_replicas": 4},
            "device_plugin_replicas=4 needs device_plugin_sharing",
        ),
        # What a stage used to refuse on its own, after the stages before it had run
        # (issue 44): a version of another branch (the driver plan), a collectors file
        # dcgm-exporter does not start with.
        (
            {"driver_branch": "550", "driver_version": "535.261.03"},
            "driver_version: '535.261.03' is not of driver_branch 550; expected a 550.x.y",
        ),
        (
            {"exporter_collectors": "DCGM_FI_DEV_GPU_UTIL\nDCGM_FI_DEV_FB_USED\n"},
            "exporter_collectors: expected the text of a dcgm-exporter collectors CSV, a line "
            "per field: <DCGM field>, <gauge|counter|histogram|summary|label>, <help> (# begins "
            "a comment), or empty for the package's default counters; line 1 "
            "('DCGM_FI_DEV_GPU_UTIL') has 1 field(s), not 3.",
        ),
        (
            {"exporter_collectors": "DCGM_FI_DEV_GPU_UTIL, gauges, GPU utilization.\n"},
            "has the metric type 'gauges'",
        ),
        ({"exporter_collectors": "# only a comment\n"}, "it names no field"),
        (
            {"k8s_manifests_exporter_collectors": "42, gauge, x"},
            "k8s_manifests_exporter_collectors: expected the text of a dcgm-exporter",
        ),
        # A key's text is never repeated, only its length.
        (
            {"driver_secure_boot_signing_key": "secret-ish", **CERTIFICATE},
            "driver_secure_boot_signing_key: expected a private key in PEM form "
            "(-----BEGIN PRIVATE KEY-----), or empty; the value (10 characters) holds no "
            "PRIVATE KEY block.",
        ),
        (
            {
                **KEY,
                "driver_secure_boot_signing_certificate": "-----BEGIN CERTIFICATE-----\n"
                "not base64!\n-----END CERTIFICATE-----\n",
            },
            "driver_secure_boot_signing_certificate: expected a certificate in PEM form "
            "(-----BEGIN CERTIFICATE-----), or empty; the CERTIFICATE block of the value "
            "(66 characters) is not base64.",
        ),
        (
            {**KEY, "driver_secure_boot_signing_certificate": ""},
            "driver_secure_boot_signing_certificate: expected it with "
            "driver_secure_boot_signing_key (DKMS signs with both), got nothing.",
        ),
        (
            {"slurm_gres_autodetect": "nvml", "slurm_gres_types": {"Tesla T4": "t4"}},
            "slurm_gres_types: expected empty with slurm_gres_autodetect 'nvml': Slurm's "
            "AutoDetect names the types itself",
        ),
        (
            {"driver_kernel_updates": "held", "driver_kernel_release": "linux-image-amd64"},
            'driver_kernel_release: expected a kernel release as uname -r prints it, such as "6.1',
        ),
        (
            {"driver_kernel_release": "6.1.0-41-amd64"},
            "driver_kernel_release: '6.1.0-41-amd64' needs driver_kernel_updates: held",
        ),
    ],
)
def test_a_wrong_value_is_named_with_the_form_expected(values, words):
    found = settings.problems(values)
    assert any(words in problem for problem in found), found


@pytest.mark.parametrize(
    "values",
    [
        {"driver_debian_mirror": "http://127.0.0.1:8080/debian"},
        {"driver_cuda_repo_base_url": "file:///srv/gpufleet-repo/cuda"},
        {"driver_cuda_repo_apt_selector": "release l=CUDA,o=NVIDIA"},
        {"exporter_repo_apt_selector": "origin developer.download.nvidia.com"},
        {"driver_version": "535.261.03", "driver_branch": "535"},
        {
            "driver_cuda_repo_key_fingerprints": [
                "EB69 3B30 35CD 5710 E231  E123 A4B4 6996 3BF8 63CC"
            ]
        },
        {"exporter_repo_key_fingerprints": ["eb693b3035cd5710e231e123a4b469963bf863cc", "A" * 64]},
        {"exporter_version": "1:3.3.9-1", "toolkit_version": "1.18.0~rc.1-1"},
        {"k8s_manifests_tolerations": [{"operator": "Exists"}]},
        {
            "k8s_manifests_tolerations": [
                {"key": "gpu", "value": "a100", "effect": "NoExecute", "tolerationSeconds": 60}
            ]
        },
        {"k8s_manifests_kubeconfig": "~/.kube/config", "k8s_manifests_render_dir": ""},
        {
            "k8s_manifests_device_plugin_image": "registry.local:5000/nvidia/plugin@sha256:"
            + "a" * 64
        },
        {
            "device_plugin_mode": "host",
            "device_plugin_host_binary_url": "file:///srv/p",
            "device_plugin_host_binary_checksum": "sha256:" + "0" * 64,
        },
        {"device_plugin_sharing": "time-slicing", "device_plugin_replicas": 4},
        {"exporter_listen_address": "[::1]", "exporter_hostengine_address": "10.0.0.5:5555"},
        {"driver_branch": "550", "driver_version": "550.163.01"},
        {"driver_branch": "550", "driver_version": ""},
        # dcgm-exporter's own file: comments (also with commas), blank lines, a quoted
        # help text with a comma, exporter-side fields.
        {
            "exporter_collectors": "# Format,,\n# DCGM FIELD, Prometheus metric type, help\n\n"
            "DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).\n"
            'DCGM_FI_DEV_XID_ERRORS, gauge,"Value of the last XID error, if any."\n'
            "DCGM_EXP_XID_ERRORS_COUNT, gauge, Count of XID errors.\n"
            "DCGM_FI_DRIVER_VERSION, label, Driver version"
        },
        {"exporter_collectors": "", "k8s_manifests_exporter_collectors": ""},
        {**KEY, **CERTIFICATE},
        {"driver_secure_boot_signing_key": "", "driver_secure_boot_signing_certificate": ""},
        {"slurm_gres_autodetect": "nvml", "slurm_gres_types": {}},
        {"slurm_gres_autodetect": "", "slurm_gres_types": {"Tesla T4": "t4"}},
        {"driver_kernel_updates": "held", "driver_kernel_release": "6.12.57+deb13-amd64"},
        {"driver_kernel_updates": "held", "driver_kernel_release": "5.14.0-427.13.1.el9_4.x86_64"},
        {"driver_kernel_updates": "guarded", "driver_kernel_release": ""},
    ],
)
def test_a_right_value_passes(values):
    assert settings.problems(values) == []


@pytest.mark.parametrize(
    ("role", "values", "words"),
    [
        # The case: a number where the collectors file's text goes. Ansible's
        # argument spec makes "42" of it, which passed; the role is given 42.
        (
            "exporter",
            {"exporter_collectors": 42},
            "exporter_collectors: expected the text of a dcgm-exporter collectors CSV, a line "
            "per field: <DCGM field>, <gauge|counter|histogram|summary|label>, <help> (# begins "
            "a comment), or empty for the package's default counters, got 42 (a number, not a "
            'string; quote it: "42").',
        ),
        # -e NAME=VALUE gives strings; ansible-core refuses "true" as a condition.
        (
            "k8s_manifests",
            {"k8s_manifests_apply": "true"},
            "k8s_manifests_apply: expected true or false, got 'true' (a string, not true or "
            "false; -e k8s_manifests_apply=... gives a string: give it as JSON, "
            """-e '{"k8s_manifests_apply": true}', or in the inventory).""",
        ),
        (
            "exporter",
            {"exporter_port": "9401"},
            "exporter_port: expected a TCP port, 1-65535, got '9401' (a string, not a whole "
            "number;",
        ),
        (
            "device_plugin",
            {"device_plugin_replicas": "2"},
            "device_plugin_replicas: expected a whole number, got '2' (a string",
        ),
        (
            "runtime_config",
            {"runtime_config_runtimes": "containerd"},
            "runtime_config_runtimes: expected a list of strings, each one of: containerd, "
            "docker, crio, got 'containerd' (a string, not a list;",
        ),
        (
            "runtime_config",
            {"runtime_config_services": "containerd=k3s"},
            "runtime_config_services: expected keys among containerd, docker, crio and systemd "
            "unit names as values, got 'containerd=k3s' (a string, not a mapping;",
        ),
        (
            "driver",
            {"driver_branch": 550},
            'driver_branch: expected a three-digit driver branch such as "535" (or empty: the '
            'installed one, or the default), got 550 (a number, not a string; quote it: "550").',
        ),
        (
            "driver",
            {"driver_version": None},
            'got None (null, not a string; write "" for empty).',
        ),
        ("driver", {"driver_gpu_consumers": ["dcgm.service", 7]}, "driver_gpu_consumers[1]"),
        ("mig", {"mig_config": 42}, "mig_config: expected a layout name of the MIG file"),
        ("exporter", {"exporter_mode": True}, "exporter_mode: expected a string, one of: host"),
    ],
)
def test_a_value_is_judged_as_written_not_as_ansible_would_convert_it(role, values, words):
    found = _check(role, **values)
    assert len(found) == 1 and words in found[0], found


def test_a_mig_layout_must_be_one_of_the_file_it_is_read_from(tmp_path):
    """The layout's name and the file are the controller's to judge, before discovery;
    whether the layout fits a node's GPUs is for after it (playbooks/facts.yml)."""
    assert _check("mig", mig_config="all-balanced", mig_config_file="") == []
    (found,) = _check("mig", mig_config="all-halves", mig_config_file="")
    shipped = PROJECT / "roles" / "mig" / "files" / "mig-parted-config.yaml"
    assert found.startswith(
        f"mig_config: expected the name of a layout in {shipped} (or empty: MIG left alone), "
        "got 'all-halves': no layout named 'all-halves'; the file has: all-1g.10gb, "
    )
    assert found.endswith(", all-balanced, all-disabled, all-enabled.")
    site = tmp_path / "mig.yaml"
    site.write_text(
        "version: v1\nmig-configs:\n  halves:\n    - {devices: all, mig-enabled: false}\n"
    )
    assert _check("mig", mig_config="halves", mig_config_file=str(site)) == []
    assert (
        "the file has: halves."
        in _check("mig", mig_config="all-balanced", mig_config_file=str(site))[0]
    )
    missing = str(tmp_path / "none.yaml")
    assert _check("mig", mig_config="halves", mig_config_file=missing) == [
        f"mig_config_file: expected a readable file, got '{missing}' (No such file or directory)."
    ]
    site.write_text("version: v2\n")
    assert _check("mig", mig_config="halves", mig_config_file=str(site)) == [
        f"mig_config_file: expected a mig-parted config file, got '{site}': version: expected "
        "'v1', found 'v2'."
    ]
    # Without a layout asked for, the file is not read.
    assert _check("mig", mig_config="", mig_config_file=missing) == []


def test_the_cluster_side_names_hosts_gpufleet_manages():
    options = _options("k8s_manifests")
    values = {"k8s_manifests_hosts": ["gpu-1", "gpu-9"]}
    assert settings.check(options, values, managed_hosts={"gpu-1", "gpu-2"}) == [
        "k8s_manifests_hosts: expected hosts gpufleet manages (of gpufleet_hosts, default the "
        "group gpu_nodes; or empty: all of them), got 'gpu-9', which are not among them."
    ]
    assert settings.check(options, {"k8s_manifests_hosts": []}, managed_hosts=set()) == []


def test_site_checks_every_stage_first():
    site = yaml.safe_load((PROJECT / "site.yml").read_text())
    assert site[0]["ansible.builtin.import_playbook"] == "playbooks/settings.yml"
    play = yaml.safe_load((PROJECT / "playbooks" / "settings.yml").read_text())[0]
    assert play["any_errors_fatal"] is True
    assert sorted(play["tasks"][0]["gpufleet.nvidia.settings_check"]["roles"]) == ROLES


def test_one_bad_host_stops_the_run_before_any_play_touches_a_host(tmp_path):
    """site.yml on two local hosts, one with a bad value of a late stage: the run ends
    in the settings play, naming host and variable; no host reaches the facts play."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "gpu_nodes": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": sys.executable,
                    },
                    "hosts": {
                        "good": {},
                        "bad": {
                            "k8s_manifests_image_pull_policy": "Sometimes",
                            "driver_reboot_timeout": "-5",
                        },
                    },
                }
            }
        )
    )
    rc, report = run_ansible("ansible-playbook", "-i", str(inventory), str(PROJECT / "site.yml"))
    assert rc != 0
    names = [play["play"]["name"] for play in report["plays"]]
    assert names == ["Check every stage's settings on every node before any change"], names
    outcome = report["plays"][0]["tasks"][0]["hosts"]
    assert not outcome["good"].get("failed")
    message = outcome["bad"]["msg"]
    assert message.startswith("Settings of bad refused before any change (2):")
    assert "k8s_manifests_image_pull_policy must be one of: Always, IfNotPresent, Never" in message
    assert (
        "driver_reboot_timeout: expected a whole number of seconds from 1 to 86400, got '-5' "
        "(a string, not a whole number" in message
    )
    assert json.dumps(report["stats"]).count('"changed": 0') == 2


def test_a_value_made_from_facts_is_left_to_the_roles_own_check(tmp_path):
    """Before the facts play nothing about the node is known: a setting built from its
    facts is not judged then (the role checks it once the facts exist)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "gpu_nodes": {
                    "vars": {"ansible_connection": "local"},
                    "hosts": {
                        "node": {
                            "driver_branch": "{{ ansible_facts.gpufleet.driver.branch }}",
                            "exporter_port": "{{ 9400 + 1 }}",
                        }
                    },
                }
            }
        )
    )
    rc, report = run_ansible(
        "ansible-playbook", "-i", str(inventory), str(PROJECT / "playbooks" / "settings.yml")
    )
    assert rc == 0, report["plays"][0]["tasks"][0]["hosts"]


def _inventory(tmp_path, bad):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "gpu_nodes": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": sys.executable,
                    },
                    "hosts": {"good": {}, "bad": bad},
                }
            }
        )
    )
    return inventory


COLLECTORS_42 = (
    "exporter_collectors: expected the text of a dcgm-exporter collectors CSV, a line per "
    "field: <DCGM field>, <gauge|counter|histogram|summary|label>, <help> (# begins a "
    "comment), or empty for the package's default counters, got 42 (a number, not a "
    'string; quote it: "42").'
)


def test_exporter_collectors_42_is_refused_before_any_stage_runs(tmp_path):
    """Issue 44: `exporter_collectors: 42` passed the settings pass and was refused only
    when the exporter stage started, after the earlier stages had run on the node. Now
    site.yml ends in its settings play, naming the host, the variable and the form."""
    inventory = _inventory(tmp_path, {"exporter_collectors": 42})
    rc, report = run_ansible("ansible-playbook", "-i", str(inventory), str(PROJECT / "site.yml"))
    assert rc != 0
    names = [play["play"]["name"] for play in report["plays"]]
    assert names == ["Check every stage's settings on every node before any change"], names
    outcome = report["plays"][0]["tasks"][0]["hosts"]
    assert not outcome["good"].get("failed")
    assert (
        outcome["bad"]["msg"] == f"Settings of bad refused before any change (1): {COLLECTORS_42}"
    )
    assert json.dumps(report["stats"]).count('"changed": 0') == 2


def test_the_reconcilers_settings_pass_refuses_it_too(tmp_path):
    """The reconciler checks a host's settings with the same play before it plans or
    applies anything there (runner.sweep: engine.check_settings)."""
    inventory = _inventory(tmp_path, {"exporter_collectors": 42})
    engine = AnsibleEngine(PROJECT, str(inventory), tmp_path / "ansible")
    refused = engine.check_settings(["good", "bad"])
    assert list(refused) == ["bad"]
    assert "Settings of bad refused before any change (1)" in refused["bad"]
    assert COLLECTORS_42 in refused["bad"]


def test_hosts_outside_the_managed_group_are_never_contacted(tmp_path):
    """A site's shared inventory: the settings pass (the first play of site.yml) runs on
    the group gpu_nodes, or on the pattern gpufleet_hosts names; a web server that
    cannot be reached is in no play, and so no run fails on it."""
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_nodes": {"hosts": {"gpu-1": local}},
                        "dgx": {"hosts": {"dgx-1": local}},
                        "web": {"hosts": {"www-1": {"ansible_host": "192.0.2.1"}}},
                    }
                }
            }
        )
    )
    playbook = str(PROJECT / "playbooks" / "settings.yml")
    for extra, hosts in (([], {"gpu-1"}), (["-e", "gpufleet_hosts=dgx"], {"dgx-1"})):
        rc, report = run_ansible("ansible-playbook", "-i", str(inventory), *extra, playbook)
        assert rc == 0, report
        # and the controller itself, which checks that the pattern matches a host
        assert set(report["stats"]) == hosts | {"localhost"}
        assert set(report["plays"][0]["tasks"][0]["hosts"]) == hosts


def test_an_inventory_without_the_gpu_nodes_fails_the_run_saying_so(tmp_path):
    """Ansible only warns of a pattern that matches no host and ends "ok": a site whose
    group is spelt otherwise (or the wrong -i) is told, and the run fails."""
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"gpu-nodes": {"hosts": {"gpu-1": local}}}))
    playbook = str(PROJECT / "playbooks" / "settings.yml")
    for extra, pattern in (([], "gpu_nodes"), (["-e", "gpufleet_hosts=dgx"], "dgx")):
        rc, report = run_ansible("ansible-playbook", "-i", str(inventory), *extra, playbook)
        assert rc == 2, report
        assert set(report["stats"]) == {"localhost"}  # no node was contacted
        [outcome] = report["plays"][-1]["tasks"][0]["hosts"].values()
        assert outcome["msg"].startswith(
            f"No host of the inventory matches {pattern}, so nothing would be done"
        )


def _together(**values):
    return settings.together(values, str(PROJECT / "roles" / "mig"))


@pytest.mark.parametrize(
    ("layout", "strategy", "refusal"),
    [
        # The layout alone: the strategy follows it.
        ("all-1g.5gb", "auto", ""),
        ("all-balanced", "auto", ""),
        ("all-disabled", "auto", ""),
        ("all-1g.5gb", "single", ""),
        ("all-1g.5gb", "mixed", ""),
        ("all-balanced", "mixed", ""),
        ("all-disabled", "none", ""),
        ("all-disabled", "mixed", ""),
        (
            "all-1g.5gb",
            "none",
            "device_plugin_mig_strategy: expected single or mixed (or auto, which follows the "
            "layout) with mig_config 'all-1g.5gb', which enables MIG: with none the device "
            "plugin would advertise no usable GPU; got 'none'.",
        ),
        (
            "all-balanced",
            "single",
            "device_plugin_mig_strategy: expected mixed (or auto, which follows the layout) "
            "with mig_config 'all-balanced', whose GPUs are not all of one profile (",
        ),
        (
            "all-disabled",
            "single",
            "device_plugin_mig_strategy: expected none or mixed (or auto, which follows the "
            "layout) with mig_config 'all-disabled', which disables MIG; got 'single'.",
        ),
    ],
)
def test_a_mig_layout_and_the_device_plugins_strategy_are_checked_together(
    layout, strategy, refusal
):
    found = _together(mig_config=layout, device_plugin_mig_strategy=strategy)
    if not refusal:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(refusal), found


def test_mps_sharing_cannot_follow_a_layout_that_enables_mig():
    found = _together(mig_config="all-1g.5gb", device_plugin_sharing="mps")
    assert found == [
        "device_plugin_sharing: mps cannot share MIG devices, and mig_config 'all-1g.5gb' "
        "enables MIG; expected none or time-slicing there."
    ]
    assert _together(mig_config="all-1g.5gb", device_plugin_mode="none") == []
    assert _together(device_plugin_mig_strategy="single") == [], "no layout: MIG left alone"


def test_the_settings_pass_refuses_a_strategy_that_does_not_fit_the_layout(tmp_path):
    """The whole pass, as site.yml's first play runs it: a layout with the strategy none
    is refused on its host, naming both; the layout alone passes."""
    inventory = _inventory(
        tmp_path, {"mig_config": "all-1g.5gb", "device_plugin_mig_strategy": "none"}
    )
    document = yaml.safe_load(inventory.read_text())
    document["gpu_nodes"]["hosts"]["good"] = {"mig_config": "all-1g.5gb"}
    inventory.write_text(yaml.safe_dump(document))
    rc, report = run_ansible(
        "ansible-playbook", "-i", str(inventory), str(PROJECT / "playbooks" / "settings.yml")
    )
    assert rc != 0
    outcome = report["plays"][0]["tasks"][0]["hosts"]
    assert not outcome["good"].get("failed"), outcome["good"]
    assert "device_plugin_mig_strategy: expected single or mixed" in outcome["bad"]["msg"]
    assert "with mig_config 'all-1g.5gb', which enables MIG" in outcome["bad"]["msg"]


def test_a_containers_switch_that_is_not_a_boolean_is_refused_naming_it(tmp_path):
    """gpufleet_containers is read by four stages: a value Ansible would not take as a
    boolean is refused in the settings pass, before any stage could read it its own way."""
    inventory = _inventory(tmp_path, {"gpufleet_containers": "sometimes"})
    engine = AnsibleEngine(PROJECT, str(inventory), tmp_path / "ansible")
    refused = engine.check_settings(["good", "bad"])
    assert list(refused) == ["bad"]
    assert "gpufleet_containers: got 'sometimes'; expected true or false" in refused["bad"]
    fine = _inventory(tmp_path, {"gpufleet_containers": "no"})
    engine = AnsibleEngine(PROJECT, str(fine), tmp_path / "ansible2")
    assert engine.check_settings(["good", "bad"]) == {}


def test_a_wrong_health_override_is_refused_by_the_reconcilers_settings_pass(tmp_path):
    """gpu_health_actions belongs to no role: the modules every run makes read it (the
    probe among them), so a wrong one is refused before the host is probed, named."""
    inventory = _inventory(tmp_path, {"gpu_health_actions": {"xid:79": "panic"}})
    engine = AnsibleEngine(PROJECT, str(inventory), tmp_path / "ansible")
    refused = engine.check_settings(["good", "bad"])
    assert list(refused) == ["bad"]
    assert (
        "gpu_health_actions: 'xid:79': 'panic' is not one of none, watch, reset, reboot, "
        "replace; expected a dict of health signal (or xid:<number>) to none, watch, reset, "
        "reboot or replace (docs/health.md)."
    ) in refused["bad"]
    fine = _inventory(tmp_path, {"gpu_health_actions": {"xid:74": "replace", "pcie-width": "none"}})
    engine = AnsibleEngine(PROJECT, str(fine), tmp_path / "ansible2")
    assert engine.check_settings(["good", "bad"]) == {}
