# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Bad settings of the node roles fail before anything is written, naming the variable.

The real roles run against the local machine in check mode with a fixture sysfs
tree (one GPU), as in test_driver_role_input: every case must fail in validation,
before the first task that could write a file.
"""

from __future__ import annotations

import pytest
from test_driver_role_input import failure, run_role

H100 = "0x2330"


@pytest.mark.parametrize(
    ("role", "variables", "message"),
    [
        (
            "toolkit",
            {"toolkit_version": "latest"},
            'toolkit_version: expected a toolkit version such as "1.17.8"',
        ),
        (
            "toolkit",
            {"toolkit_cdi_spec_path": "cdi/nvidia.yaml"},
            "toolkit_cdi_spec_path: expected an absolute path ending in .yaml",
        ),
        ("toolkit", {"toolkit_repo_channel": "nightly"}, "toolkit_repo_channel"),
        ("runtime_config", {"runtime_config_runtimes": ["podman"]}, "runtime_config_runtimes"),
        ("runtime_config", {"runtime_config_install": ["crio"]}, "runtime_config_install"),
        (
            "runtime_config",
            {"runtime_config_runtime_name": "nvidia gpu"},
            "runtime_config_runtime_name: expected letters, digits, - or _",
        ),
        (
            "runtime_config",
            {"runtime_config_runtime_name": 'nv"idia'},
            "runtime_config_runtime_name: expected letters",
        ),
        (
            "runtime_config",
            {"runtime_config_runtime_path": "bin/nvidia-container-runtime"},
            "runtime_config_runtime_path: expected an absolute path",
        ),
        (
            "runtime_config",
            {"runtime_config_config_paths": {"containerd": "etc/containerd/config.toml"}},
            "runtime_config_config_paths: expected keys among",
        ),
        (
            "runtime_config",
            {"runtime_config_config_paths": {"podman": "/etc/containers/containers.conf"}},
            "keys among containerd, docker, crio",
        ),
        (
            "runtime_config",
            {"runtime_config_containerd_drop_in_path": "/etc/containerd/conf.d/99-nvidia"},
            "runtime_config_containerd_drop_in_path: expected an absolute path ending in .toml",
        ),
        ("validator", {"validator_toolkit_container": "maybe"}, "validator_toolkit_container"),
        (
            "device_plugin",
            {"device_plugin_sharing": "time-slicing", "device_plugin_replicas": 0},
            "device_plugin_replicas=0; expected a whole number of at least 1",
        ),
        (
            "device_plugin",
            {"device_plugin_mig_strategy": "automatic"},
            "device_plugin_mig_strategy",
        ),
        (
            "device_plugin",
            {"device_plugin_mode": "host"},
            "device_plugin_host_binary_url: device_plugin_mode is host",
        ),
        ("exporter", {"exporter_port": 70000}, "exporter_port: expected a TCP port, 1-65535"),
        ("exporter", {"exporter_mode": "daemonset"}, "exporter_mode"),
        (
            "slurm_gres",
            {"slurm_gres_manage": True, "slurm_gres_types": {"Tesla T4": "tesla t4"}},
            "slurm_gres_types: expected GPU model names (as NVML reports them) mapped to GRES",
        ),
        ("slurm_gres", {"slurm_gres_conf_path": "gres.conf"}, "slurm_gres_conf_path"),
        (
            "mig",
            {"mig_config": "all-halves"},
            "mig_config: expected the name of a layout in",
        ),
        ("mig", {"mig_config": "all-halves"}, "no layout named 'all-halves'"),
        # An A100 40GB profile: no entry of the shipped layout reaches an H100.
        ("mig", {"mig_config": "all-1g.5gb"}, "none of its entries reaches a GPU here"),
        ("mig", {"mig_config": "wrong-profile", "mig_config_file": "SITE"}, "offers no '1g.5gb'"),
        ("mig", {"mig_config": "too-many", "mig_config_file": "SITE"}, "do not fit on one GPU"),
        ("mig", {"mig_config": "second-gpu", "mig_config_file": "SITE"}, "GPU index 1 does not"),
    ],
)
def test_bad_settings_fail_before_any_change(tmp_path, role, variables, message):
    if variables.get("mig_config_file") == "SITE":
        variables = {**variables, "mig_config_file": str(_site_mig_config(tmp_path))}
    rc, report = run_role(tmp_path, role, H100, **variables)
    assert rc != 0
    assert message in failure(report)
    assert report["stats"]["localhost"]["changed"] == 0


def _site_mig_config(tmp_path):
    """A site's own mig-parted file with layouts an H100 80GB cannot take."""
    path = tmp_path / "site-mig.yaml"
    path.write_text(
        "version: v1\n"
        "mig-configs:\n"
        "  wrong-profile:\n"
        "    - {devices: all, mig-enabled: true, mig-devices: {1g.5gb: 7}}\n"
        "  too-many:\n"
        "    - {devices: all, mig-enabled: true, mig-devices: {3g.40gb: 3}}\n"
        "  second-gpu:\n"
        "    - {devices: [1], mig-enabled: true, mig-devices: {7g.80gb: 1}}\n"
    )
    return path


def test_a_mig_layout_on_a_gpu_without_mig_is_refused(tmp_path):
    rc, report = run_role(tmp_path, "mig", "0x1eb8", mig_config="all-balanced")  # a T4
    assert rc != 0
    assert "none of its entries reaches a GPU here that has MIG" in failure(report)
    assert report["stats"]["localhost"]["changed"] == 0


def test_several_bad_runtime_settings_are_named_together(tmp_path):
    rc, report = run_role(
        tmp_path,
        "runtime_config",
        H100,
        runtime_config_runtime_name="a b",
        runtime_config_runtime_path="relative",
    )
    assert rc != 0
    message = failure(report)
    assert "runtime_config_runtime_name" in message
    assert "runtime_config_runtime_path" in message
