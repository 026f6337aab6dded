# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The driver role's install plan, as a filter over gpu_facts results."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.module_utils.lazy import LazyModule

dp = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_plan")
kernels = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.kernels")
kernel_updates = LazyModule(
    "ansible_collections.gpufleet.nvidia.plugins.module_utils.kernel_updates"
)
node_state = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.node_state")
secureboot = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.secureboot")


def driver_offer_prefix(facts, source="distro"):
    """What to ask apt for to learn the branches the node's source offers; see
    driver_plan.offer_prefix."""
    return dp.offer_prefix(((facts.get("os") or {}).get("id") or "").lower(), source)


def driver_desired(
    facts, branch="", version="", module_type="auto", manage="auto", source="distro", offers=()
):
    """The driver the node should run; see driver_plan.desired. `offers`: apt's
    package names for driver_offer_prefix."""
    os_facts = facts.get("os") or {}
    os_id, os_version = (os_facts.get("id") or "").lower(), os_facts.get("version_id") or ""
    offered = dp.offered_branches(os_id, source, offers or [], os_version)
    try:
        return dp.desired(
            branch,
            version,
            module_type,
            manage,
            facts.get("driver") or {},
            facts.get("gpus", []),
            offered,
            dp.fixed_branches(os_id, source, os_version),
        )
    except dp.PlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


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
    adopted=False,
):
    """The install plan. For an adopted driver (`adopted`: its branch taken from the
    node), loaded, that these settings cannot install (another source's packages, a
    branch the source lacks), no plan but `{"as_is": why}`: the driver is left as the
    node has it."""
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
        if not adopted:  # a driver that runs them is proof enough
            dp.check_gpus(str(branch), module_type, facts.get("gpus", []))
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
        # Only a driver that runs is left as it is; any other is refused as named.
        if adopted and (facts.get("driver") or {}).get("state") == "loaded":
            return {"as_is": str(exc)}
        raise AnsibleFilterError(str(exc)) from exc


def driver_kernel_modules(plan, available=(), installed_images=()):
    """The kernel-module packages for a node; see driver_plan.kernel_modules."""
    return dp.kernel_modules(plan, available or [], installed_images or [])


def driver_kernel_repair(plan, release, available=()):
    """What gives kernel `release` the driver's module; see kernels.repair_packages."""
    return kernels.repair_packages(plan, release, available or [])


def driver_kernel_holds(listing, family, owned=(), exclude=(), locked=""):
    """The kernel packages to hold, and which holds are gpufleet's; see
    kernel_updates.plan. `listing` is what the role's dpkg-query (rpm -q on RHEL)
    printed, `locked` dnf's versionlock.list (RHEL)."""
    if family == "rhel":
        packages = kernel_updates.installed_rpm(listing, node_state.versionlocked(locked or ""))
    else:
        packages = kernel_updates.installed_dpkg(listing)
    return kernel_updates.plan(packages, owned or [], exclude or [])


def driver_differs(driver, plan):
    """Whether the driver (version, module_type) is not the one the plan installs."""
    return dp.differs(driver.get("version"), driver.get("module_type"), plan)


def certificate_fingerprint(pem):
    """The SHA-256 fingerprint of a PEM certificate's DER, as gpu_facts'
    secure_boot_enrolled lists them; see secureboot.pem_fingerprint."""
    found = secureboot.pem_fingerprint(pem)
    if found is None:
        raise AnsibleFilterError("certificate_fingerprint: no PEM certificate in the input")
    return found


class FilterModule:
    def filters(self):
        return {
            "driver_desired": driver_desired,
            "driver_offer_prefix": driver_offer_prefix,
            "driver_plan": driver_plan,
            "driver_kernel_modules": driver_kernel_modules,
            "driver_kernel_repair": driver_kernel_repair,
            "driver_kernel_holds": driver_kernel_holds,
            "driver_differs": driver_differs,
            "certificate_fingerprint": certificate_fingerprint,
        }
