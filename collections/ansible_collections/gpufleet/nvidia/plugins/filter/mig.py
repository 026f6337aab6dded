# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""MIG on the controller: a layout checked against a node's GPUs before any change,
and the GPUs whose MIG mode change waits for a reset.

Documentation: mig_layout_check.yml and mig_reset_pending.yml next to this file.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.module_utils.lazy import LazyModule

mig_config = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_config")
mig_profiles = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_profiles")


def _gpu(index, fact):
    try:
        device_id = int(str(fact.get("device_id")), 16)
    except ValueError as exc:
        raise AnsibleFilterError(f"GPU {index}: no PCI device id in the facts") from exc
    # Known from the profile table without a driver; from the driver for other models
    # (mig_mode is true or false on a GPU that has MIG, none where it has not).
    capable = device_id in mig_profiles.MODELS or fact.get("mig_mode") is not None
    return mig_config.Gpu(index, device_id, capable)


def mig_layout_check(gpus, config, name):
    """{errors, unchecked} for layout `name` of mig-parted config `config` (its parsed
    YAML) on GPUs from gpu_facts (in nvidia-smi's index order, which is PCI order)."""
    if not isinstance(gpus, list):
        raise AnsibleFilterError("mig_layout_check: expected the node's GPU list")
    try:
        entries = mig_config.select(mig_config.parse_config(config), name)
    except mig_config.MigConfigError as exc:
        return {"errors": [str(exc)], "unchecked": []}
    verdict = mig_config.check(entries, [_gpu(i, g) for i, g in enumerate(gpus)])
    return {"errors": list(verdict.errors), "unchecked": list(verdict.unchecked)}


def mig_reset_pending(gpus):
    """Indexes of the GPUs (from gpu_facts) whose MIG mode differs from the mode they
    take at their next reset: a change the driver could not make current because
    something held the GPU."""
    if not isinstance(gpus, list):
        raise AnsibleFilterError("mig_reset_pending: expected the node's GPU list")
    return [
        index
        for index, gpu in enumerate(gpus)
        if gpu.get("mig_mode") is not None
        and gpu.get("mig_mode_pending") is not None
        and gpu["mig_mode"] != gpu["mig_mode_pending"]
    ]


class FilterModule:
    def filters(self):
        return {"mig_layout_check": mig_layout_check, "mig_reset_pending": mig_reset_pending}
