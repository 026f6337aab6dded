#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: settings_check
short_description: Check the settings of gpufleet's roles for a host, before any change
version_added: 0.1.0
description:
  - Checks every setting of the named roles as the host's variables give it (the role's
    default where the host has none) in three steps. First its kind as written, which
    is what the role is given - a number is not a string, C("false") (what
    C(-e NAME=VALUE) gives) is not a boolean, C("9400") is not a whole number, C("a,b")
    is not a list - where Ansible's own check of a role's argument spec converts such a
    value and lets it through. Then against each role's argument spec
    (C(meta/argument_specs.yml)), choices and elements, as Ansible does when the role
    starts. Then against the forms a spec cannot say (URL schemes and hosts, ranges,
    absolute paths, package version shapes, names Kubernetes accepts, a collectors CSV
    dcgm-exporter reads), settings that go together (a driver version of the driver
    branch), and what settings name (a MIG layout of its file, cluster-side hosts of the
    inventory), kept in the collection's C(module_utils/settings.py).
  - Runs on the controller only and never connects to the host, so a run whose first
    play is this check changes no host when a setting is wrong; C(site.yml) does this
    for every stage, with O(roles) naming all of them.
  - Fails with one sentence per wrong setting, each naming the variable, the form
    expected and the value found.
options:
  roles:
    description:
      - Roles whose settings to check, by name (looked up in the roles path and next to
        the playbook) or by directory, such as C({{ role_path }}) inside a role.
    type: list
    elements: str
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  platform:
    platforms: posix
notes:
  - An action plugin; this file holds its documentation.
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check every stage's settings before any node is changed
  gpufleet.nvidia.settings_check:
    roles: [driver, toolkit, runtime_config, validator]

- name: Inside a role, check its own settings first
  gpufleet.nvidia.settings_check:
    roles: ["{{ role_path }}"]
"""

RETURN = r"""
roles:
  description: The directories of the roles whose settings were checked, by name.
  returned: always
  type: list
  elements: str
  sample: [driver, toolkit]
problems:
  description: One sentence per wrong setting; empty when all are well-formed.
  returned: always
  type: list
  elements: str
  sample:
    - "driver_reboot_timeout: expected a whole number of seconds from 1 to 86400, got -5."
"""
