# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The inventory, read in this process with Ansible's own API, as `ansible-inventory
--list` reads it (the engine falls back to that command where this could differ)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

log = logging.getLogger("runner")

# -- the inventory, read in this process --------------------------------------------
#
# `ansible-inventory --list` costs a Python and an Ansible start every cycle. Ansible's
# own API gives the same variables in this process, but Ansible reads its configuration
# (ANSIBLE_CONFIG, the ANSIBLE_* environment, ansible.cfg) once, when first imported:
# it is imported under the engine's environment (then restored), and used only while
# that reading still stands (_InProcessAnsible.unusable); otherwise the engine runs
# ansible-inventory as before.


# Ansible's state is the process's: one import, one read at a time.
_ANSIBLE_LOCK = threading.Lock()


class Unreadable(Exception):
    """The inventory does not parse, or --limit is not a pattern (Ansible's words)."""


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `values` while it lasts, as it was afterwards. Only what a
    subprocess of the engine gets anyway: another thread's run sees no difference."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _ansible_environ(env: Mapping[str, str]) -> dict[str, str]:
    """The ANSIBLE_* environment Ansible would read under `env`."""
    merged = {**os.environ, **env}
    return {name: value for name, value in merged.items() if name.startswith("ANSIBLE_")}


def _file_state(path: str) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


class _InProcessAnsible:
    """Ansible's inventory API, imported in this process under `env`."""

    def __init__(self, env: Mapping[str, str], project: Path) -> None:
        self.config = env["ANSIBLE_CONFIG"]
        self.environ = _ansible_environ(env)
        self.config_state = _file_state(self.config)
        # Relative paths in ANSIBLE_* variables, and {{CWD}} in ansible.cfg, resolve
        # from the working directory, which is the project for ansible-inventory.
        cwd_free = self.config_state and "{{CWD}}" not in Path(self.config).read_text()
        self.paths_alike = Path.cwd().resolve() == project.resolve() or bool(
            cwd_free and not set(self.environ) - set(env)
        )
        self.broken = ""
        self.api = SimpleNamespace()
        if "ansible.constants" in sys.modules:
            self.broken = "Ansible was imported before, under another environment"
            return
        try:
            with _environment(env):
                self.api = _import_ansible()
        except ImportError as error:
            self.broken = f"Ansible cannot be imported ({error})"

    def unusable(self, env: Mapping[str, str], project: Path) -> str:
        """Why reading here could differ from ansible-inventory run with `env` ("" if
        it could not)."""
        if self.broken:
            return self.broken
        constants = self.api.C
        if env["ANSIBLE_CONFIG"] != self.config or _ansible_environ(env) != self.environ:
            return "the ANSIBLE_* environment changed since Ansible was imported"
        if self.config_state is None or _file_state(self.config) != self.config_state:
            return f"{self.config} is missing or changed since Ansible read it"
        if not self.paths_alike:
            return f"run outside the project {project}, ANSIBLE_* paths would differ"
        if constants.INVENTORY_EXPORT:
            return "inventory_export is set"
        vault = constants.DEFAULT_VAULT_PASSWORD_FILE or constants.DEFAULT_VAULT_IDENTITY_LIST
        if vault or constants.DEFAULT_ASK_VAULT_PASS:
            return "vault secrets are configured (ansible-inventory sets them up itself)"
        return ""

    def hostvars(
        self,
        env: Mapping[str, str],
        inventory: str,
        project: Path,
        limit: str | None,
        pattern: str = "all",
    ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """What the engine read from `ansible-inventory -i INVENTORY --list [--limit
        LIMIT]` run in `project`: the variables of each host of `pattern` (as a play of
        those hosts gets them), magic ones left out; and the names of all the
        inventory's hosts. Warnings stay out of the output (ansible-inventory's went
        unread) but explain an error."""
        api = self.api
        source = inventory  # as the CLI takes -i: a host list, else a path
        if "," not in source:
            source = api.unfrackpath(inventory, follow=False, basedir=str(project))
        with (
            _ANSIBLE_LOCK,
            _environment(env),
            api.DeferredWarningContext(variables={}) as warnings,
        ):
            try:
                return _read_hostvars(api, source, str(project), limit, pattern)
            except Exception as error:  # ansible-inventory fails on any, in words
                words = str(error) if isinstance(error, api.AnsibleError) else repr(error)
                said = [
                    api.format_message(w, False).splitlines()[0] for w in warnings.get_warnings()
                ]
                raise Unreadable("; ".join([words, *said])) from None


def _import_ansible() -> SimpleNamespace:
    """The parts of Ansible that `ansible-inventory --list` uses (ansible/cli/inventory.py),
    imported now, with the plugin and collection loaders set up as its CLI does."""
    from ansible._internal._display_utils import DeferredWarningContext, format_message

    with DeferredWarningContext(variables={}):  # Ansible's own start-up warnings
        from ansible import constants
        from ansible._internal._json._profiles._inventory_legacy import Encoder
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.plugins.loader import init_plugin_loader
        from ansible.utils.collection_loader import AnsibleCollectionConfig
        from ansible.utils.path import unfrackpath
        from ansible.vars.manager import VariableManager

        if AnsibleCollectionConfig.collection_finder is None:
            init_plugin_loader()
    return SimpleNamespace(
        C=constants,
        AnsibleError=AnsibleError,
        DataLoader=DataLoader,
        DeferredWarningContext=DeferredWarningContext,
        Encoder=Encoder,
        InventoryManager=InventoryManager,
        VariableManager=VariableManager,
        format_message=format_message,
        unfrackpath=unfrackpath,
    )


def _read_hostvars(
    api: SimpleNamespace, source: str, basedir: str, limit: str | None, pattern: str
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    # As InventoryCLI.run and json_inventory do: the loader's base directory is the
    # working directory there (playbook-adjacent group_vars are read from it).
    _forget_vars_files()
    loader = api.DataLoader()
    loader.set_basedir(basedir)
    inventory = api.InventoryManager(loader=loader, sources=[source])
    variables = api.VariableManager(loader=loader, inventory=inventory)
    every = [host.name for host in inventory.get_hosts("all")]
    if limit:
        inventory.subset(limit)
    internal = api.C.INTERNAL_STATIC_VARS
    hostvars = {}
    for host in inventory.get_hosts(pattern):
        values = variables.get_vars(host=host, include_hostvars=False, stage="all")
        hostvars[host.name] = {k: v for k, v in values.items() if k not in internal}
    # Through the JSON ansible-inventory prints: its encoder marks untrusted strings,
    # keeps vaulted values encrypted and turns tuples and dates into JSON's types.
    text = json.dumps({"_meta": {"hostvars": hostvars}}, cls=api.Encoder, sort_keys=True)
    read: dict[str, dict[str, Any]] = json.loads(text)["_meta"]["hostvars"]
    return read, every


def _forget_vars_files() -> None:
    """The group_vars and host_vars plugin remembers, for the process's life, which
    files it found (and which directories were missing): forget, so that a file
    added between cycles is read, as a new ansible-inventory process would."""
    plugin = sys.modules.get("ansible.plugins.vars.host_group_vars")
    for cache in ("FOUND", "NAK", "CANONICAL_PATHS"):
        found = getattr(plugin, cache, None)
        if found is not None:
            found.clear()


_ANSIBLE: _InProcessAnsible | None = None
_ANSIBLE_SAID: set[str] = set()


def ansible(env: Mapping[str, str], project: Path) -> _InProcessAnsible | None:
    """This process's Ansible (imported on first use), if it reads the inventory as
    ansible-inventory would; None (saying why, once) if not."""
    global _ANSIBLE
    with _ANSIBLE_LOCK:
        if _ANSIBLE is None:
            _ANSIBLE = _InProcessAnsible(env, project)
        why = _ANSIBLE.unusable(env, project)
        if not why:
            return _ANSIBLE
        if why not in _ANSIBLE_SAID:
            _ANSIBLE_SAID.add(why)
            log.info("reading the inventory with ansible-inventory: %s", why)
        return None
