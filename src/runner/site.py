# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The site's Ansible, under the runner: its configuration governs, and the options
sites use unattended pass through to every run.

Which `ansible.cfg` governs is found as Ansible finds it (`ANSIBLE_CONFIG`, then
`./ansible.cfg`, `~/.ansible.cfg`, `/etc/ansible/ansible.cfg`), from where the runner
was started; only a site without one gets gpufleet's own. To the site's settings
gpufleet adds what it must, where its roles and its collection are, ahead of the
site's own paths (`ANSIBLE_ROLES_PATH`, `ANSIBLE_COLLECTIONS_PATH`: a site role called
`driver`, or another copy of gpufleet.nvidia, must not replace what the runner hashed
and checks), and nothing else.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
from collections.abc import Sequence
from pathlib import Path


def config_environment(project: Path) -> dict[str, str]:
    """The ANSIBLE_* variables of the runner's Ansible runs: the site's configuration
    file with gpufleet's roles and collection added, or gpufleet's own file."""
    # Imported here: Ansible's configuration module, not its constants (importing those
    # reads the configuration once for the process, before the engine's environment).
    from ansible.config.manager import ConfigManager, find_ini_config_file

    found = find_ini_config_file()
    if found is None:
        return {"ANSIBLE_CONFIG": str(project / "ansible.cfg")}
    config = ConfigManager(conf_file=found)
    roles = _joined(config.get_config_value("DEFAULT_ROLES_PATH"), project / "roles")
    collections = _joined(config.get_config_value("COLLECTIONS_PATHS"), project / "collections")
    return {
        "ANSIBLE_CONFIG": str(Path(found).resolve()),
        "ANSIBLE_ROLES_PATH": roles,
        "ANSIBLE_COLLECTIONS_PATH": collections,
    }


def _joined(site: Sequence[str] | None, ours: Path) -> str:
    paths = [str(Path(path).expanduser()) for path in site or []]
    return os.pathsep.join([str(ours), *(path for path in paths if path != str(ours))])


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of ansible-playbook that pass through to every run."""
    group = parser.add_argument_group("the site's Ansible (passed to every run)")
    group.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        default=[],
        type=_extra,
        metavar="VARS",
        help="extra variables, as ansible-playbook takes them (KEY=VALUE, JSON or @FILE); "
        "repeatable; part of every host's desired state",
    )
    group.add_argument(
        "--vault-id",
        action="append",
        default=[],
        type=_vault_id,
        metavar="ID",
        help="LABEL@FILE or FILE (a password file or script; nobody is there to answer a "
        "prompt); repeatable",
    )
    group.add_argument(
        "--vault-password-file",
        action="append",
        default=[],
        type=_abs,
        metavar="FILE",
        help="repeatable",
    )
    group.add_argument(
        "--private-key", type=_abs, metavar="FILE", help="the SSH key to connect with"
    )
    group.add_argument("-u", "--user", help="the remote user to connect as")
    group.add_argument("-b", "--become", action="store_true", help="run with become")


def passed_through(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(every run's options, the vault options alone, which the inventory's readers
    take too). Their paths were made absolute when parsed, so that a run's command
    line and the desired state's digest name the same files wherever they are read."""
    vault = [
        *(a for vault_id in args.vault_id for a in ("--vault-id", vault_id)),
        *(a for path in args.vault_password_file for a in ("--vault-password-file", path)),
    ]
    run = [*(a for extra in args.extra_vars for a in ("--extra-vars", extra)), *vault]
    if args.private_key:
        run += ["--private-key", args.private_key]
    if args.user:
        run += ["--user", args.user]
    if args.become:
        run.append("--become")
    return run, vault


def extra_vars_digest(options: Sequence[str]) -> str:
    """What the extra variables among `options` say, as a digest: the text of each, and
    the bytes of each file named with @ (read again each time: edited, it counts).
    Empty when there are none."""
    values = [value for option, value in itertools.pairwise(options) if option == "--extra-vars"]
    if not values:
        return ""
    digest = hashlib.sha256()
    for value in values:
        digest.update(value.encode() + b"\0")
        if value.startswith("@"):
            try:
                digest.update(Path(value[1:]).read_bytes())
            except OSError as error:
                digest.update(f"unreadable: {error.strerror}".encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _abs(path: str) -> str:
    return str(Path(path).expanduser().absolute())


def _extra(value: str) -> str:
    return "@" + _abs(value[1:]) if value.startswith("@") else value


def _vault_id(value: str) -> str:
    """[LABEL@]SOURCE, the source a password file or script, made absolute."""
    # As Ansible splits it: the label before the first @.
    label, at, source = value.partition("@") if "@" in value else ("", "", value)
    if source in ("prompt", "prompt_ask_vault_pass"):
        raise argparse.ArgumentTypeError(
            f"{value!r}: the runner runs unattended, nobody can answer a prompt; name a "
            "password file or script (LABEL@FILE)"
        )
    return f"{label}{at}{_abs(source)}"
