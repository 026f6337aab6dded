#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: repo_key
short_description: Install a package repository's signing key only if it is the pinned one
version_added: 0.1.0
description:
  - Downloads an OpenPGP public key file (ASCII-armoured or binary) and fingerprints
    every primary key in it. Only when each of them is among O(fingerprints) is the
    file written to O(dest), atomically; otherwise the task fails, naming the
    fingerprints found and expected, and O(dest) is left as it was.
  - Meant for the keyring an apt source names with C(signed-by), as apt trusts every key
    in that file for that repository, so a key swapped on the server or on the way
    (a compromised mirror, a proxy) is refused before apt could trust it.
  - Subkeys are not compared; apt accepts them only with a binding signature of their
    primary key.
  - The download is read-only, so check mode fetches and compares too, and predicts
    whether O(dest) would change.
options:
  url:
    description: Where the key file is (http, https or file URL).
    type: str
    required: true
  dest:
    description:
      - Where to write it. A name ending in C(.asc) needs an ASCII-armoured file, as
        apt reads it so; C(.gpg) a binary one.
    type: path
    required: true
  fingerprints:
    description:
      - The primary-key fingerprints accepted (40 hex digits for version 4 keys, 64
        for version 6), spaces and case ignored. More than one lets a site accept a
        vendor's new key before the old one is retired.
    type: list
    elements: str
    required: true
  setting:
    description:
      - Name of the variable the fingerprints come from, named in the error so a user
        knows what to change.
    type: str
  mode:
    description: Permissions of O(dest).
    type: raw
    default: "0644"
  timeout:
    description: Seconds to wait for the download.
    type: int
    default: 30
  validate_certs:
    description: Check the server's TLS certificate.
    type: bool
    default: true
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
- name: Install the signing key of NVIDIA's CUDA repository, pinned
  gpufleet.nvidia.repo_key:
    url: https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/3bf863cc.pub
    dest: /etc/apt/keyrings/nvidia-cuda.asc
    fingerprints: [EB693B3035CD5710E231E123A4B469963BF863CC]
    setting: driver_cuda_repo_key_fingerprints
"""

RETURN = r"""
fingerprints:
  description: The primary-key fingerprints of the downloaded file, in file order.
  returned: success, and failure after the download
  type: list
  elements: str
  sample: [EB693B3035CD5710E231E123A4B469963BF863CC]
dest:
  description: The file written (or that would be).
  returned: always
  type: str
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url

from ansible_collections.gpufleet.nvidia.plugins.module_utils.openpgp import (
    KeyFileError,
    fingerprints,
    is_armoured,
    normalise,
)


def _download(module, url):
    response, info = fetch_url(module, url, timeout=module.params["timeout"])
    # file: URLs answer without an HTTP status.
    if response is None or info.get("status", 200) not in (200, None):
        module.fail_json(msg=f"{url}: the key could not be downloaded ({info.get('msg')})")
    return response.read()


def _current(dest):
    try:
        with open(dest, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _write(module, dest, data):
    directory = os.path.dirname(dest) or "."
    fd, staging = tempfile.mkstemp(dir=directory, prefix=".repo_key-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        module.atomic_move(staging, dest)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "fingerprints": {"type": "list", "elements": "str", "required": True, "no_log": False},
            "setting": {"type": "str"},
            "mode": {"type": "raw", "default": "0644"},
            "timeout": {"type": "int", "default": 30},
            "validate_certs": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    url, dest = module.params["url"], module.params["dest"]
    pinned = [normalise(f) for f in module.params["fingerprints"]]
    setting = module.params["setting"] or "fingerprints"
    if not pinned:
        module.fail_json(msg=f"{setting} is empty: no key for {url} would be trusted.", dest=dest)

    data = _download(module, url)
    try:
        found = fingerprints(data)
    except KeyFileError as error:
        module.fail_json(
            msg=f"{url} is not an OpenPGP public key file ({error}); {dest} was not changed.",
            dest=dest,
        )
    unpinned = [f for f in found if f not in pinned]
    if unpinned:
        module.fail_json(
            msg=(
                f"{url} holds the key {', '.join(unpinned)}, which {setting} does not pin "
                f"(it pins {', '.join(pinned)}); {dest} was not changed. If the vendor has "
                f"rotated its key, check the new fingerprint against the one it publishes "
                f"and add it to {setting}."
            ),
            fingerprints=found,
            dest=dest,
        )
    if dest.endswith(".asc") and not is_armoured(data):
        module.fail_json(
            msg=f"{url} is a binary key file, and apt reads {dest} as ASCII-armoured: "
            f"name it .gpg instead.",
            fingerprints=found,
            dest=dest,
        )

    current = _current(dest)
    changed = current != data
    if changed and not module.check_mode:
        _write(module, dest, data)
    result = {"changed": changed, "fingerprints": found, "dest": dest}
    if module._diff and changed:
        before = (current or b"").decode("utf-8", "replace") if is_armoured(current or b"") else ""
        after = data.decode("utf-8", "replace") if is_armoured(data) else ""
        result["diff"] = {"before": before, "after": after, "before_header": dest}
    file_args = module.load_file_common_arguments({"path": dest, "mode": module.params["mode"]})
    if os.path.exists(dest):
        result["changed"] = module.set_fs_attributes_if_different(file_args, changed)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
