#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_set
short_description: Install a set of packages that move together in one apt transaction
version_added: 0.2.0
description:
  - Installs (and removes) packages in one C(apt-get install) transaction, with the
    packages of O(same_version) at exactly one upstream version, as an NVIDIA driver's
    packages and its fabric manager must be. Upgrades and downgrades alike.
  - Before anything is changed the whole set is resolved against the node's package
    sources and pins and the transaction simulated (C(apt-get install --simulate)); a
    package or version the sources lack, or a set apt cannot resolve, fails naming the
    package and version, and nothing is changed.
  - Check mode resolves and simulates the same way and reports the transaction apply
    would carry out. With O(preferences), apt sees the pin files as the run will
    have written them, also in check mode, where they are not written.
  - With O(download_only), the set's packages are fetched into apt's cache and nothing
    is installed (a preflight, before a node is taken out of service); so are the
    packages installed now that the transaction would replace, for a rollback (RV(undo)).
options:
  install:
    description: Packages to install, by name.
    type: list
    elements: str
    required: true
  same_version:
    description:
      - The packages of O(install) that are installed at the upstream version
        O(version) (no epoch, no Debian revision), whichever revision the sources
        offer. Versions a pin forbids (priority below 0) are not taken.
    type: list
    elements: str
    default: []
  version:
    description:
      - The upstream version of O(same_version), such as C(535.261.03). Empty takes
        the version of the candidate of the first package of O(same_version).
    type: str
    default: ""
  remove:
    description:
      - Packages removed in the same transaction where they are installed; a name
        that is not installed, or that no package source knows, is passed over.
    type: list
    elements: str
    default: []
  preferences:
    description:
      - apt preferences files as the run has them, by path in C(/etc/apt/preferences.d)
        (C(content) null - the file absent). apt reads these in place of the files on
        disk for this transaction only; nothing is written.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file's path.
        type: path
        required: true
      content:
        description: Its content, or null where the run removes it.
        type: str
  download_only:
    description: Fetch the transaction's packages into apt's cache; install nothing.
    type: bool
    default: false
  lock_timeout:
    description: Seconds to wait for the dpkg lock.
    type: int
    default: 60
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: debian
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Move the driver and its fabric manager to 535.261.03 together
  gpufleet.nvidia.apt_set:
    install: [nvidia-kernel-dkms, nvidia-smi, nvidia-fabricmanager-535]
    same_version: [nvidia-kernel-dkms, nvidia-smi, nvidia-fabricmanager-535]
    version: "535.261.03"
"""

RETURN = r"""
version:
  description: The upstream version of O(same_version) (empty where there are none).
  returned: always
  type: str
transaction:
  description: What apt installs, upgrades, downgrades or removes, one entry per package.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The package.
      type: str
    action:
      description: install, upgrade, downgrade or remove.
      type: str
    from:
      description: The installed version (null for an install).
      type: str
    to:
      description: The version installed (null for a removal).
      type: str
downgrade:
  description: Whether the transaction downgrades a package.
  returned: always
  type: bool
summary:
  description: The transaction in words.
  returned: always
  type: str
undo:
  description:
    - The transaction that puts back what this one changes, for a rollback with this
      module (O(install) takes C(name=version)).
  returned: always
  type: dict
  contains:
    install:
      description: Each package changed or removed, as C(name=version-installed-before).
      type: list
      elements: str
    remove:
      description: Each package this transaction installs new.
      type: list
      elements: str
    hold:
      description: The packages of RV(undo.install) that were held, to hold again.
      type: list
      elements: str
preferences_before:
  description: The files of O(preferences) as they were on disk before (C(content)
    null - absent), to put back with the rest.
  returned: always
  type: list
  elements: dict
undo_problem:
  description:
    - With O(download_only), why the packages installed now could not be fetched
      into apt's cache for a rollback (empty when they were, or nothing changes).
  returned: always
  type: str
"""

import contextlib
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils import apt_set

PREFERENCES_DIR = "/etc/apt/preferences.d"


@contextlib.contextmanager
def preferences_overlay(preferences):
    """apt options that show apt the pin files as the run has them: a copy of the
    preferences directory with those files replaced, where any differs from disk."""
    wanted = {os.path.basename(p["path"]): p.get("content") for p in preferences}
    if all(_on_disk(name) == content for name, content in wanted.items()):
        yield []
        return
    overlay = tempfile.mkdtemp(prefix="gpufleet-apt-prefs-")
    try:
        names = os.listdir(PREFERENCES_DIR) if os.path.isdir(PREFERENCES_DIR) else []
        for name in names:
            if name not in wanted:
                shutil.copy(os.path.join(PREFERENCES_DIR, name), overlay)
        for name, content in wanted.items():
            if content is not None:
                with open(os.path.join(overlay, name), "w", encoding="utf-8") as handle:
                    handle.write(content)
        yield ["-o", f"Dir::Etc::PreferencesParts={overlay}"]
    finally:
        shutil.rmtree(overlay, ignore_errors=True)


def _on_disk(name):
    try:
        with open(os.path.join(PREFERENCES_DIR, name), encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _apt_get(module, options, arguments, mode):
    argv = [
        "apt-get",
        "install",
        *([mode] if mode else []),
        "--yes",
        "--quiet",
        "--no-install-recommends",
        "--allow-downgrades",
        "--allow-change-held-packages",
        "-o",
        f"DPkg::Lock::Timeout={module.params['lock_timeout']}",
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
        *options,
        *arguments,
    ]
    return module.run_command(argv)


ARGUMENT_SPEC = {
    "install": {"type": "list", "elements": "str", "required": True},
    "same_version": {"type": "list", "elements": "str", "default": []},
    "version": {"type": "str", "default": ""},
    "remove": {"type": "list", "elements": "str", "default": []},
    "preferences": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "path": {"type": "path", "required": True},
            "content": {"type": "str"},
        },
    },
    "download_only": {"type": "bool", "default": False},
    "lock_timeout": {"type": "int", "default": 60},
}


def _arguments(module, options):
    """(version, apt's policy, apt-get's arguments) for the set, each exact version
    resolved."""
    params = module.params
    names = list(dict.fromkeys(params["install"]))
    bare = [name.split("=", 1)[0] for name in names]
    remove = params["remove"]
    rc, out, err = module.run_command(["apt-cache", *options, "policy", *bare, *remove])
    if rc != 0:
        module.fail_json(msg=f"apt-cache policy failed: {err.strip()}")
    policy = apt_set.parse_policy(out)
    try:
        version = apt_set.target_version(policy, params["version"], params["same_version"])
        arguments = apt_set.specs(policy, names, params["same_version"], version)
    except apt_set.AptSetError as exc:
        module.fail_json(msg=str(exc), version=params["version"])
    return version, policy, arguments + [f"{name}-" for name in apt_set.installed(policy, remove)]


def _in_place(module, policy, arguments):
    """Whether the set is installed whole as asked, so that apt-get would find nothing
    to do: told from apt's policy and dpkg's status, without apt-get --simulate (most
    of a second of CPU on every steady pass)."""
    if not apt_set.at_versions(policy, arguments):
        return False
    rc, audit, _err = module.run_command(["dpkg", "--audit"])
    if rc != 0 or audit.strip():
        return False
    names = [argument.partition("=")[0] for argument in arguments]
    query = ["dpkg-query", "--show", "--showformat=${db:Status-Abbrev}\\n", *names]
    rc, status, _err = module.run_command(query)
    return rc == 0 and apt_set.whole(status)


def _simulate(module, options, arguments, version):
    """The transaction apt-get would make (apt_set.parse_simulation)."""
    rc, out, err = _apt_get(module, options, arguments, "--simulate")
    if rc != 0:
        module.fail_json(
            msg=f"apt cannot install {' '.join(arguments)}: {apt_set.refusal(out + err)}",
            version=version,
        )
    return apt_set.parse_simulation(out)


def _held(module):
    rc, out, _err = module.run_command(["apt-mark", "showhold"])
    return out.split() if rc == 0 else []


def _fetch_undo(module, options, undo):
    """Fetch the packages installed now into apt's cache, so that the set can be put
    back after a failed change even where the sources no longer offer them. Returns
    what kept that from happening ('' when nothing did)."""
    if not undo["install"]:
        return ""
    rc, out, err = _apt_get(module, options, ["--reinstall", *undo["install"]], "--download-only")
    return "" if rc == 0 else apt_set.refusal(out + err)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.run_command_environ_update = {"LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}
    params = module.params
    before = [
        {"path": p["path"], "content": _on_disk(os.path.basename(p["path"]))}
        for p in params["preferences"]
    ]
    with preferences_overlay(params["preferences"]) as options:
        version, policy, arguments = _arguments(module, options)
        steps = (
            []
            if _in_place(module, policy, arguments)
            else _simulate(module, options, arguments, version)
        )
        result = {
            "version": version,
            "transaction": steps,
            "downgrade": any(step["action"] == "downgrade" for step in steps),
            "summary": apt_set.summary(steps),
            "undo": apt_set.undo(steps, _held(module) if steps else ()),
            "preferences_before": before,
            "undo_problem": "",
        }
        # Fetching is the preflight's whole point, so it happens in check mode too:
        # it fills apt's cache and changes nothing else.
        mode = "--download-only" if params["download_only"] else None
        if steps and mode:
            result["undo_problem"] = _fetch_undo(module, [], result["undo"])
        if steps and (mode or not module.check_mode):
            rc, out, err = _apt_get(module, options, arguments, mode)
            if rc != 0:
                module.fail_json(
                    msg=f"apt-get install failed: {apt_set.refusal(out + err)}",
                    arguments=arguments,
                    **result,
                )
    module.exit_json(changed=bool(steps) and not params["download_only"], **result)


if __name__ == "__main__":
    main()
