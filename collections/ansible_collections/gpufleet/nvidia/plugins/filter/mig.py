# Copyright: gpufleet developers
# Apache License 2.0 (see the repository's LICENSE)
"""A MIG layout checked against a node's GPUs on the controller, before any change.

Documentation: mig_layout_check.yml next to this file.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.module_utils import mig_config, mig_profiles

# nvidia-smi's mig.mode.current on a GPU that has MIG (others answer "[N/A]").
_MIG_MODES = ("Enabled", "Disabled")


def _gpu(index, fact):
    try:
        device_id = int(str(fact.get("device_id")), 16)
    except ValueError as exc:
        raise AnsibleFilterError(f"GPU {index}: no PCI device id in the facts") from exc
    # Known from the profile table without a driver; from the driver for other models.
    capable = device_id in mig_profiles.MODELS or fact.get("mig_mode") in _MIG_MODES
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


class FilterModule:
    def filters(self):
        return {"mig_layout_check": mig_layout_check}
