# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action settings_check: every role's settings of a host, checked on the controller."""

from __future__ import annotations

import os

from ansible import constants as C
from ansible.errors import AnsibleError, AnsibleUndefinedVariable
from ansible.module_utils.parsing.convert_bool import BOOLEANS_FALSE, BOOLEANS_TRUE
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import lookup_loader

from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_health import check_overrides
from ansible_collections.gpufleet.nvidia.plugins.module_utils.settings import check, together


def _overrides(value):
    if not isinstance(value, dict):
        raise ValueError(f"got {value!r}")
    check_overrides(value)  # its HealthInputError is a ValueError


def _boolean(value):
    # What Ansible's `bool` takes, as a YAML inventory or -e writes it.
    if not isinstance(value, (bool, int, str)) or value not in BOOLEANS_TRUE | BOOLEANS_FALSE:
        raise ValueError(f"got {value!r}")


# Settings of no one role, read by several stages or by modules every play runs
# (gpu_facts, the probe): name -> (check raising ValueError with the words, the form
# expected).
SITE_SETTINGS = {
    "gpu_health_actions": (
        _overrides,
        "a dict of health signal (or xid:<number>) to none, watch, reset, reboot or "
        "replace (docs/health.md)",
    ),
    "gpufleet_containers": (
        _boolean,
        "true or false (false: the node runs no containers: the toolkit, runtime_config "
        "and device_plugin stages are disabled, the validator runs only a CUDA sample)",
    ),
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(
            argument_spec={"roles": {"type": "list", "elements": "str", "required": True}}
        )
        found, checked, merged, role_dirs = [], [], {}, {}
        managed = self._managed_hosts(task_vars)
        for role in args["roles"]:
            role_dir = self._role_dir(role, task_vars)
            spec = self._load(role_dir, "meta/argument_specs.yml")
            options = ((spec.get("argument_specs") or {}).get("main") or {}).get("options") or {}
            values = self._values(options, self._load(role_dir, "defaults/main.yml"), task_vars)
            # The values as the role will be given them: their kind is judged as written,
            # not as Ansible's argument spec would convert them.
            found.extend(check(options, values, role_dir, managed))
            checked.append(os.path.basename(role_dir))
            merged.update(values)
            role_dirs[role] = role_dir
        found.extend(self._site_problems(task_vars))
        # The stages' settings that only go wrong together (the MIG layout and the
        # device plugin's MIG strategy), where each was well-formed on its own.
        if not found:
            found.extend(together(merged, role_dirs.get("mig")))
        result.update(changed=False, roles=checked, problems=found)
        if found:
            host = task_vars.get("inventory_hostname", "this host")
            result["failed"] = True
            result["msg"] = (
                f"Settings of {host} refused before any change ({len(found)}): " + " ".join(found)
            )
        else:
            result["msg"] = f"The settings of {', '.join(checked)} are well-formed."
        return result

    def _managed_hosts(self, task_vars):
        """The hosts gpufleet manages: those of the pattern gpufleet_hosts (the plays'
        hosts), all of them, whatever --limit leaves in this run."""
        pattern = task_vars.get("gpufleet_hosts") or "gpu_nodes"
        lookup = lookup_loader.get(
            "inventory_hostnames", loader=self._loader, templar=self._templar
        )
        return set(lookup.run([pattern], variables=task_vars))

    def _role_dir(self, role, task_vars):
        if "/" in role:
            candidates = [role]
        else:
            playbook_dir = task_vars.get("playbook_dir", ".")
            bases = [
                os.path.join(playbook_dir, "roles"),
                os.path.join(playbook_dir, "..", "roles"),
                *C.DEFAULT_ROLES_PATH,
            ]
            candidates = [os.path.join(base, role) for base in bases]
        for candidate in candidates:
            if os.path.isfile(os.path.join(candidate, "meta", "argument_specs.yml")):
                return os.path.normpath(candidate)
        raise AnsibleError(
            f"settings_check: no role {role!r} with a meta/argument_specs.yml in "
            + ", ".join(candidates)
        )

    def _load(self, role_dir, name):
        path = os.path.join(role_dir, name)
        if not os.path.isfile(path):
            return {}
        # The role's own files, as trusted as Ansible holds them when it runs the role.
        return self._loader.load_from_file(path, trusted_as_template=True) or {}

    def _site_problems(self, task_vars):
        found = []
        values = self._values(SITE_SETTINGS, {}, task_vars)
        for name, value in values.items():
            judge, expected = SITE_SETTINGS[name]
            try:
                judge(value)
            except ValueError as exc:
                found.append(f"{name}: {exc}; expected {expected}.")
        return found

    def _values(self, options, defaults, task_vars):
        """The host's value of every option: its own, else the role's default, templated.

        A value built from what is not known yet (facts, before the play that gathers
        them) is left to the role's own check, which runs when they are."""
        variables = {**defaults, **task_vars}
        templar = self._templar.copy_with_new_env(available_variables=variables)
        values = {}
        for name in options:
            if name not in variables:
                continue
            try:
                values[name] = templar.template(variables[name])
            except AnsibleUndefinedVariable:
                continue
        return values
