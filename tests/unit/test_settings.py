"""The settings rules: the forms argument specs cannot say, checked before any change.

`settings.problems` is the one place; the `settings_check` action runs it with each
role's argument spec, first in site.yml for every stage and again in each role.
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.module_utils import settings
from conftest import PROJECT, run_ansible

ROLES = sorted(p.parent.parent.name for p in PROJECT.glob("roles/*/meta/argument_specs.yml"))


def _options(role):
    spec = yaml.safe_load((PROJECT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"]


def _defaults(role):
    return yaml.safe_load((PROJECT / "roles" / role / "defaults" / "main.yml").read_text()) or {}


@pytest.mark.parametrize("role", ROLES)
def test_every_setting_has_a_form_and_the_defaults_have_it(role):
    for name, option in _options(role).items():
        formless = option["type"] != "bool" and "choices" not in option
        if formless:
            known = name in settings.RULES or name in settings.FREE_FORM
            assert known, f"{name} ({option['type']}) has no form in module_utils/settings.py"
    literal = {k: v for k, v in _defaults(role).items() if "{{" not in str(v)}
    assert settings.problems(literal) == []


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
        ({"mig_repo_key_fingerprints": []}, "mig_repo_key_fingerprints: expected"),
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
        ({"mig_repo_apt_selector": "o=NVIDIA"}, 'apt_preferences "Pin:" value'),
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
    ],
)
def test_a_right_value_passes(values):
    assert settings.problems(values) == []


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
                "all": {
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
        "driver_reboot_timeout: expected a whole number of seconds from 1 to 86400, got -5"
        in message
    )
    assert json.dumps(report["stats"]).count('"changed": 0') == 2


def test_a_value_made_from_facts_is_left_to_the_roles_own_check(tmp_path):
    """Before the facts play nothing about the node is known: a setting built from its
    facts is not judged then (the role checks it once the facts exist)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
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
