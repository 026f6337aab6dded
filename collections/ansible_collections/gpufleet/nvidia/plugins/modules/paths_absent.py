#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: paths_absent
short_description: Make sure a set of files and directories is gone, in one module run
version_added: 0.2.0
description:
  - Removes each path of O(paths) that exists (a directory with all it holds, a link
    itself and not what it points to); a path already gone is left alone.
  - For each path it does what M(ansible.builtin.file) does with
    O(ansible.builtin.file#module:state=absent), in one module run instead of one per
    path. A stage that withdraws what an earlier
    run or another setting wrote names them all in one task, so a steady run pays one
    round trip to the node for them, not one each.
options:
  paths:
    description: Absolute paths; empty changes nothing.
    type: list
    elements: path
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Remove the pin and the repository restriction this run does not write
  gpufleet.nvidia.paths_absent:
    paths:
      - /etc/apt/preferences.d/gpufleet-nvidia-driver.pref
      - /etc/apt/preferences.d/gpufleet-cuda-repo.pref
"""

RETURN = r"""
removed:
  description: The paths that existed and were removed (or would be, in check mode), in
    the order given.
  returned: always
  type: list
  elements: str
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule


def present(paths):
    """The paths of `paths` that exist (a dangling link counts), each once, in order."""
    found = []
    for path in paths:
        if os.path.lexists(path) and path not in found:
            found.append(path)
    return found


def remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def main():
    module = AnsibleModule(
        argument_spec={"paths": {"type": "list", "elements": "path", "required": True}},
        supports_check_mode=True,
    )
    paths = module.params["paths"]
    relative = [path for path in paths if not os.path.isabs(path)]
    if relative:
        module.fail_json(msg=f"paths: expected absolute paths, got {', '.join(relative)}")
    removed = present(paths)
    result = {"changed": bool(removed), "removed": removed}
    if module._diff:
        result["diff"] = [
            {
                "before_header": path,
                "after_header": path,
                "before": "present\n",
                "after": "absent\n",
            }
            for path in removed
        ]
    if not module.check_mode:
        for path in removed:
            try:
                remove(path)
            except OSError as exc:
                module.fail_json(msg=f"could not remove {path}: {exc.strerror}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
