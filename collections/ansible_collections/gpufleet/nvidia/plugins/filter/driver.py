# Copyright: gpufleet developers
# Apache License 2.0 (see the repository's LICENSE)
"""The driver role's install plan, as a filter over gpu_facts results."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: driver_plan
short_description: Packages and repositories that install the NVIDIA driver on a node
version_added: 0.1.0
description:
  - Takes the C(ansible_facts.gpufleet) of a node (from M(gpufleet.nvidia.gpu_facts)) and
    the driver role's settings, and returns what to install from where.
  - Fails with a message naming the variable at fault when the request cannot be met
    (unknown OS, a branch the source does not carry, open modules on a GPU that
    cannot run them, ...).
positional: _input
options:
  _input:
    description: The node's C(gpufleet) facts.
    type: dict
    required: true
  branch:
    description: Driver branch, e.g. C(535).
    type: str
    required: true
  version:
    description: Exact driver version, or empty for the newest of the branch.
    type: str
    default: ""
  module_type:
    description: C(open), C(proprietary) or C(auto).
    type: str
    default: auto
  source:
    description: C(distro) or C(cuda-repo).
    type: str
    default: distro
  cuda_repo_base_url:
    description: Base URL of NVIDIA's CUDA repositories (or a mirror).
    type: str
    required: true
  debian_mirror:
    description: Debian archive mirror.
    type: str
    default: http://deb.debian.org/debian
  debian_security_mirror:
    description: Debian security archive mirror.
    type: str
    default: http://deb.debian.org/debian-security
  fabricmanager:
    description: C(auto) (when the node has NVSwitches), C(always) or C(never).
    type: str
    default: auto
"""

EXAMPLES = r"""
- name: Work out what to install
  ansible.builtin.set_fact:
    _driver_plan: >-
      {{ ansible_facts.gpufleet | gpufleet.nvidia.driver_plan(branch='535',
         cuda_repo_base_url='https://developer.download.nvidia.com/compute/cuda/repos') }}
"""

RETURN = r"""
_value:
  description:
    - C(family), C(repositories), C(packages), C(hold), C(headers), C(fabricmanager),
      C(module_stream), C(precompiled), C(initramfs_command), C(module_type), C(branch),
      C(version).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_plan as dp


def driver_plan(
    facts,
    branch,
    cuda_repo_base_url,
    version="",
    module_type="auto",
    source="distro",
    debian_mirror="http://deb.debian.org/debian",
    fabricmanager="auto",
    debian_security_mirror="http://deb.debian.org/debian-security",
):
    computes = [
        (g["compute_major"], g["compute_minor"] or 0)
        for g in facts.get("gpus", [])
        if g.get("compute_major") is not None
    ]
    os_facts = facts.get("os") or {}
    wants_fm = fabricmanager == "always" or (
        fabricmanager == "auto" and facts.get("nvswitch_count", 0) > 0
    )
    try:
        dp.validate_request(str(branch), version or "")
        resolved = dp.resolve_module_type(module_type, str(branch), computes)
        return dp.plan(
            os_facts.get("id"),
            os_facts.get("version_id") or "",
            os_facts.get("kernel") or "",
            branch,
            version or "",
            resolved,
            source,
            cuda_repo_base_url,
            debian_mirror=debian_mirror,
            debian_security_mirror=debian_security_mirror,
            fabricmanager=wants_fm,
        )
    except dp.PlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def driver_kernel_modules(plan, available=(), installed_images=()):
    """The kernel-module packages for a node; see driver_plan.kernel_modules."""
    return dp.kernel_modules(plan, available or [], installed_images or [])


def driver_differs(driver, plan):
    """Whether the driver (version, module_type) is not the one the plan installs."""
    return dp.differs(driver.get("version"), driver.get("module_type"), plan)


class FilterModule:
    def filters(self):
        return {
            "driver_plan": driver_plan,
            "driver_kernel_modules": driver_kernel_modules,
            "driver_differs": driver_differs,
        }
