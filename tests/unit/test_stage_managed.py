# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""What each stage says it manages (`managed` in its stage fact, recorded by record.yml).

The simulated fleet is Debian only; these evaluate the roles' own `managed` variables
for Ubuntu and RHEL-family plans and for other runtime settings, with the role's vars
and defaults files loaded as the role would, without running the role.
"""

from __future__ import annotations

import json
import sys

import pytest

from conftest import PROJECT, run_ansible

PLAYBOOK = """
- name: Evaluate a role's managed variables
  hosts: localhost
  connection: local
  gather_facts: false
  vars_files:
    - {project}/roles/{role}/defaults/main.yml
    - {project}/roles/{role}/vars/main.yml
  tasks:{facts}
    - name: Show the managed items
      ansible.builtin.debug:
        msg: "{{{{ {expression} }}}}"
"""


def managed(tmp_path, role: str, facts: dict, expression: str, **variables) -> dict:
    """The value of `expression` once the `facts` (name: template, in order) are set."""
    tasks = "".join(
        f"\n    - name: Set {name} as the role's tasks would\n"
        f"      ansible.builtin.set_fact:\n        {name}: {json.dumps(value)}\n"
        for name, value in facts.items()
    )
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        PLAYBOOK.format(project=PROJECT, role=role, facts=tasks, expression=expression)
    )
    extra = {"ansible_python_interpreter": sys.executable, **variables}
    rc, report = run_ansible(
        "ansible-playbook", "-i", "localhost,", str(playbook), "-e", json.dumps(extra)
    )
    result = report["plays"][0]["tasks"][-1]["hosts"]["localhost"]
    assert rc == 0, result
    return result["msg"]


DRIVER_FACTS = {
    "_driver_plan": "{{ test_node | gpufleet.nvidia.driver_plan(branch='535',"
    " version=test_version, source=test_source,"
    " cuda_repo_base_url='https://mirror.example/cuda/repos', fabricmanager='always') }}",
    "_driver_modules": "{{ _driver_plan | gpufleet.nvidia.driver_kernel_modules("
    "test_precompiled, ['linux-image-generic']) }}",
    "_driver_packages_wanted": "{{ _driver_plan.packages + _driver_modules.packages }}",
    "_driver_packages_held": "{{ _driver_plan.hold + _driver_modules.hold }}",
}
DRIVER_MANAGED = (
    "{'files': _driver_managed_files, 'packages': _driver_managed_packages,"
    " 'services': _driver_managed_services}"
)


def node(os_id: str, version_id: str) -> dict:
    return {
        "gpus": [{"compute_major": 9, "compute_minor": 0}],
        "nvswitch_count": 4,
        "os": {"id": os_id, "version_id": version_id, "kernel": "5.15.0-91-generic"},
    }


def test_driver_on_debian_with_the_fabric_manager_from_nvidias_repository(tmp_path):
    found = managed(
        tmp_path,
        "driver",
        DRIVER_FACTS,
        DRIVER_MANAGED,
        test_node=node("debian", "12"),
        test_version="535.261.03",
        test_source="distro",
        test_precompiled=[],
    )
    assert found == {
        "files": [
            "/etc/apt/sources.list.d/zz-gpufleet-debian-nvidia.sources",
            "/etc/apt/sources.list.d/zz-gpufleet-debian-security-nvidia.sources",
            "/etc/apt/sources.list.d/nvidia-cuda.sources",
            "/etc/apt/keyrings/nvidia-cuda.asc",
            "/etc/apt/preferences.d/gpufleet-nvidia-driver.pref",
            "/etc/apt/preferences.d/gpufleet-nvidia-cuda-repo.pref",
            "/etc/modprobe.d/gpufleet-blacklist-nouveau.conf",
        ],
        "packages": [
            "nvidia-kernel-dkms",
            "nvidia-smi",
            "libnvidia-ml1",
            "libcuda1",
            "firmware-nvidia-gsp",
            "nvidia-persistenced",
            "nvidia-fabricmanager-535",
        ],
        "services": ["nvidia-persistenced", "nvidia-fabricmanager"],
    }


def test_driver_on_ubuntu_with_precompiled_modules(tmp_path):
    found = managed(
        tmp_path,
        "driver",
        DRIVER_FACTS,
        DRIVER_MANAGED,
        test_node=node("ubuntu", "22.04"),
        test_version="",
        test_source="distro",
        test_precompiled=[
            "linux-modules-nvidia-535-server-5.15.0-91-generic",
            "linux-modules-nvidia-535-server-generic",
        ],
        driver_persistenced=False,
        driver_blacklist_nouveau=False,
    )
    assert found == {
        # The driver's packages kept off NVIDIA's repository, which others may add.
        "files": ["/etc/apt/preferences.d/gpufleet-nvidia-cuda-repo.pref"],
        "packages": [
            "nvidia-headless-535-server",
            "nvidia-utils-535-server",
            "linux-modules-nvidia-535-server-5.15.0-91-generic",
            "linux-modules-nvidia-535-server-generic",
            "nvidia-fabricmanager-535",
        ],
        "services": ["nvidia-fabricmanager"],
    }


@pytest.mark.parametrize("version", ["", "535.161.08"])
def test_driver_on_rhel_lists_installed_package_names_not_streams_or_globs(tmp_path, version):
    found = managed(
        tmp_path,
        "driver",
        DRIVER_FACTS,
        DRIVER_MANAGED,
        test_node=node("rocky", "9.4"),
        test_version=version,
        test_source="cuda-repo",
        test_precompiled=[],
    )
    assert found == {
        "files": [
            "/etc/yum.repos.d/cuda-rhel9.repo",
            "/etc/modprobe.d/gpufleet-blacklist-nouveau.conf",
        ],
        "packages": [
            "nvidia-driver",
            "nvidia-driver-cuda",
            "python3-dnf-plugin-versionlock",
            "nvidia-fabric-manager",
        ],
        "services": ["nvidia-persistenced", "nvidia-fabricmanager"],
    }


def test_toolkit_on_rhel_without_the_cdi_refresh_units(tmp_path):
    found = managed(tmp_path, "toolkit", {"_toolkit_family": "dnf"}, "_toolkit_managed")
    assert found == {
        "files": [
            "/etc/yum.repos.d/nvidia-container-toolkit.repo",
            "/etc/cdi/nvidia.yaml",
            "/etc/systemd/system/gpufleet-nvidia-uvm.service",
        ],
        "packages": [
            "nvidia-container-toolkit",
            "nvidia-container-toolkit-base",
            "libnvidia-container-tools",
            "libnvidia-container1",
            "python3-dnf-plugin-versionlock",
        ],
        # The unit that loads nvidia-uvm for the spec's device files; no refresh units.
        "services": ["gpufleet-nvidia-uvm.service"],
    }


def test_runtime_config_with_docker_a_drop_in_and_a_k3s_template(tmp_path):
    found = managed(
        tmp_path,
        "runtime_config",
        {"_runtime_config_runtimes": ["containerd", "docker"]},
        "_runtime_config_managed",
        runtime_config_install=["docker"],
        runtime_config_config_paths={
            "containerd": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
        },
        runtime_config_containerd_drop_in_path="/etc/containerd/conf.d/99-nvidia.toml",
        runtime_config_services={"containerd": "k3s-agent"},
    )
    assert found == {
        "files": [
            "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl",
            "/etc/docker/daemon.json",
            "/etc/containerd/conf.d/99-nvidia.toml",
        ],
        "packages": ["docker.io", "python3-tomlkit"],
        "services": ["k3s-agent", "docker"],
    }
