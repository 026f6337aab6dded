# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Bad settings of the node roles fail before anything is written, naming the variable.

The real roles run against the local machine in check mode with a fixture sysfs
tree (one GPU), as in test_driver_role_input: every case must fail in validation,
before the first task that could write a file. Each role runs once over all of its
cases, one inventory host per case (each fails on its own).
"""

from __future__ import annotations

import functools

import pytest
from test_driver_role_input import failure, run_role_cases

H100 = "0x2330"
T4 = "0x1eb8"

BAD_SETTINGS = [
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
]
# Cases of the tests below, run with their role's: name -> (role, PCI device, variables).
OTHER_CASES = {
    "t4-layout": ("mig", T4, {"mig_config": "all-balanced"}),
    "two-bad-runtime-settings": (
        "runtime_config",
        H100,
        {"runtime_config_runtime_name": "a b", "runtime_config_runtime_path": "relative"},
    ),
}


@pytest.fixture(scope="module")
def role_runs(tmp_path_factory):
    """role -> the JSON report of its one run over its cases (BAD_SETTINGS' as case-N,
    OTHER_CASES' by name), each role run when a test first asks for it."""
    tmp = tmp_path_factory.mktemp("roles")

    @functools.cache
    def run(role: str) -> dict:
        cases: dict[str, tuple[str, dict]] = {}
        for index, (of, variables, _message) in enumerate(BAD_SETTINGS):
            if of == role:
                if variables.get("mig_config_file") == "SITE":
                    variables = {**variables, "mig_config_file": str(_site_mig_config(tmp))}
                cases[f"case-{index}"] = (H100, variables)
        for name, (of, device, variables) in OTHER_CASES.items():
            if of == role:
                cases[name] = (device, variables)
        return run_role_cases(tmp / role, role, cases)[1]

    return run


def refused(role_runs, role: str, host: str) -> str:
    """What the task that failed on `host` said; nothing was changed there."""
    report = role_runs(role)
    assert report["stats"][host]["failures"] == 1
    assert report["stats"][host]["changed"] == 0
    return failure(report, host)


@pytest.mark.parametrize("case", range(len(BAD_SETTINGS)), ids=lambda i: BAD_SETTINGS[i][2])
def test_bad_settings_fail_before_any_change(role_runs, case):
    role, _variables, message = BAD_SETTINGS[case]
    assert message in refused(role_runs, role, f"case-{case}")


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


def test_a_mig_layout_on_a_gpu_without_mig_is_refused(role_runs):
    message = refused(role_runs, "mig", "t4-layout")
    assert "none of its entries reaches a GPU here that has MIG" in message


def test_several_bad_runtime_settings_are_named_together(role_runs):
    message = refused(role_runs, "runtime_config", "two-bad-runtime-settings")
    assert "runtime_config_runtime_name" in message
    assert "runtime_config_runtime_path" in message
