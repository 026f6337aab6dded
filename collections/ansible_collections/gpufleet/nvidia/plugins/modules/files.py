#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: files
short_description: Write a set of small files, directories and removals in one module run
version_added: 0.2.0
description:
  - Brings each entry of O(files) to its state, in the order given, and leaves alone what
    is already so. A file is written only where its content or mode differs, each one
    atomically (a temporary file in the same directory, renamed over the old one); the
    directories above it that are missing are made with O(directory_mode).
  - For each entry it does what M(ansible.builtin.copy) with O(ansible.builtin.copy#module:content),
    or M(ansible.builtin.file) with C(state=directory) or C(state=absent), does for one
    path, in one module run instead of one or two per path. A stage that keeps several
    small files (markers, repository lists, unit drop-ins) names them in one task, so a
    steady run pays one round trip to the node for them.
  - Entries are not written as one transaction. An entry that fails stops the run, with
    the entries before it done and those after it untouched, and the message says which.
options:
  files:
    description: What to make so, one entry per path.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: An absolute path.
        type: path
        required: true
      state:
        description:
          - V(file) writes O(files[].content) (a link at the path is replaced by the file,
            not followed); V(directory) makes a directory; V(absent) removes a file or a
            link (not a directory).
        type: str
        choices: [file, directory, absent]
        default: file
      content:
        description: The whole content of the file (V(file) only).
        type: str
        default: ""
      mode:
        description:
          - The permissions, as an octal string (C("0644")). Defaults to C("0644") for a
            file and to O(directory_mode) for a directory.
        type: str
  directory_mode:
    description: The permissions of directories this module makes, as an octal string.
    type: str
    default: "0755"
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
- name: Write the toolkit-ready marker and withdraw cuda-ready
  gpufleet.nvidia.files:
    files:
      - path: /run/nvidia/validations/toolkit-ready
      - path: /run/nvidia/validations/cuda-ready
        state: absent
"""

RETURN = r"""
changed_paths:
  description: The paths that were written, made, given their mode or removed (or would
    be, in check mode), in the order given.
  returned: always
  type: list
  elements: str
"""

import os
import re
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule

FILE_MODE = "0644"


def octal(value, name):
    """The permission bits of an octal string such as "0644", or a ValueError naming it."""
    if not isinstance(value, str) or re.fullmatch(r"[0-7]{3,4}", value) is None:
        raise ValueError(f'{name}: expected an octal string such as "0644", got {value!r}')
    return int(value, 8)


def entries(files, directory_mode):
    """Each entry checked and completed (absolute path, state, content, mode bits), or a
    ValueError naming the entry and what was expected; nothing is touched before."""
    checked = []
    for index, entry in enumerate(files):
        name = f"files[{index}]"
        path = entry["path"]
        if not os.path.isabs(path):
            raise ValueError(f"{name}.path: expected an absolute path, got {path}")
        state = entry["state"]
        default = directory_mode if state == "directory" else FILE_MODE
        mode = octal(entry["mode"] or default, f"{name}.mode")
        checked.append({"path": path, "state": state, "content": entry["content"], "mode": mode})
    return checked


def missing_parents(path):
    """The directories above `path` that do not exist, the outermost first."""
    missing = []
    parent = os.path.dirname(path)
    while parent and not os.path.isdir(parent):
        missing.insert(0, parent)
        parent = os.path.dirname(parent)
    return missing


def read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def plan(entry):
    """What bringing one entry to its state takes: None where it is so already, else
    (diff, action); a ValueError where it cannot be done."""
    path, state, mode = entry["path"], entry["state"], entry["mode"]
    if state == "absent":
        if os.path.isdir(path) and not os.path.islink(path):
            raise ValueError(f"{path} is a directory: state absent removes only files and links")
        if not os.path.lexists(path):
            return None
        return {"before": "present\n", "after": "absent\n"}, "remove"
    if state == "directory":
        if os.path.lexists(path) and not os.path.isdir(path):
            raise ValueError(f"{path} exists and is not a directory")
        if not os.path.isdir(path):
            return {"before": "absent\n", "after": "directory\n"}, "mkdir"
        if stat.S_IMODE(os.stat(path).st_mode) != mode:
            return mode_diff(path, mode), "chmod"
        return None
    if os.path.isdir(path) and not os.path.islink(path):
        raise ValueError(f"{path} is a directory, expected a file")
    before = read(path) if not os.path.islink(path) else None
    wanted = entry["content"].encode()
    if before != wanted:
        text = "" if before is None else before.decode(errors="replace")
        return {"before": text, "after": entry["content"]}, "write"
    if stat.S_IMODE(os.lstat(path).st_mode) != mode:
        return mode_diff(path, mode), "chmod"
    return None


def mode_diff(path, mode):
    return {
        "before": f"mode {stat.S_IMODE(os.stat(path).st_mode):04o}\n",
        "after": f"mode {mode:04o}\n",
    }


def make_parents(path, directory_mode):
    for directory in missing_parents(path):
        os.mkdir(directory)
        os.chmod(directory, directory_mode)


def write(module, entry):
    path = entry["path"]
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".gpufleet.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(entry["content"].encode())
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, entry["mode"])
        module.atomic_move(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    os.chmod(path, entry["mode"])


def apply(module, entry, action, directory_mode):
    path = entry["path"]
    if action == "remove":
        os.unlink(path)
        return
    make_parents(path, directory_mode)
    if action == "mkdir":
        # (An earlier entry may have made it, as the directory above its file.)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, entry["mode"])
    elif action == "chmod":
        os.chmod(path, entry["mode"])
    else:
        write(module, entry)


def main():
    module = AnsibleModule(
        argument_spec={
            "files": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "path": {"type": "path", "required": True},
                    "state": {
                        "type": "str",
                        "choices": ["file", "directory", "absent"],
                        "default": "file",
                    },
                    "content": {"type": "str", "default": ""},
                    "mode": {"type": "str"},
                },
            },
            "directory_mode": {"type": "str", "default": "0755"},
        },
        supports_check_mode=True,
    )
    try:
        directory_mode = octal(module.params["directory_mode"], "directory_mode")
        planned = []
        for entry in entries(module.params["files"], module.params["directory_mode"]):
            step = plan(entry)
            if step is not None:
                planned.append((entry, *step))
    except ValueError as exc:
        module.fail_json(msg=str(exc), changed_paths=[])
    result = {"changed": bool(planned), "changed_paths": [entry["path"] for entry, _, _ in planned]}
    if module._diff:
        result["diff"] = [
            {"before_header": entry["path"], "after_header": entry["path"], **diff}
            for entry, diff, _ in planned
        ]
    if not module.check_mode:
        for done, (entry, _, action) in enumerate(planned):
            try:
                apply(module, entry, action, directory_mode)
            except OSError as exc:
                result["changed_paths"] = result["changed_paths"][:done]
                module.fail_json(
                    msg=(
                        f"could not {action} {entry['path']}: {exc.strerror}; the entries"
                        " before it are done, those after it untouched"
                    ),
                    **result,
                )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
