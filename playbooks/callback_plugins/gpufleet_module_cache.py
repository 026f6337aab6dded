# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Keep the modules ansible-core packs for the nodes between runs of gpufleet's playbooks.

ansible-core packs each module it sends to a node (the module with every module_utils
file it imports, found by parsing them) once per `ansible-playbook` process, into a
cache in that process's own temporary directory, removed when it ends. The reconciler
runs a playbook several times a cycle, and packing was about a third of the controller's
CPU in a pass that changes nothing (docs/verification.md). This plugin, loaded for every
playbook of playbooks/ (and site.yml, which imports them) because it sits next to them,
lends each run the packs earlier runs made and keeps the new ones it made:

- the store is GPUFLEET_MODULE_CACHE (default: $XDG_CACHE_HOME/gpufleet/ansible-modules,
  else ~/.cache/...), one directory per fingerprint of what a pack is made of: the
  version of ansible-core and of Python, and every collection on the collection path
  (its MANIFEST.json, or the files of its modules and module_utils where it has none,
  as a checkout has), and the site's module_utils directories. Anything edited, added or
  removed there makes another directory; directories unused for a day are removed;
- only modules named by their collection (ansible.modules.*, ansible_collections.*) are
  kept: a role's or a playbook's own library module has a name ansible-core does not
  tell apart from another of the same name;
- ansible-core loads a pack with pickle, so a pack is code: the store's directories are
  made 0700, and a store another user owns, or one others may write to, is not used;
- GPUFLEET_MODULE_CACHE=off turns it off; nothing it does can fail a run: where the
  store cannot be read or written, the run packs its modules as it would without it.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpufleet_module_cache
type: aggregate
short_description: keeps ansible-core's packed modules between runs of gpufleet's playbooks
description:
  - Lends each run of gpufleet's playbooks the modules earlier runs packed, and keeps the
    ones it packs, in a store keyed by the versions of ansible-core, Python and the
    collections on the collection path.
  - Loaded without being enabled, for the playbooks next to it only.
options: {}
"""

import atexit
import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
import time

from ansible import constants as C
from ansible.plugins.callback import CallbackBase
from ansible.release import __version__ as ANSIBLE_VERSION

# ansible-core's cache of packed modules inside the run's temporary directory
# (ansible/executor/module_common.py), and the names of the packs worth keeping.
RUN_CACHE = "ansiballz_cache"
KEPT = ("ansible.modules.", "ansible_collections.")
UNUSED_FOR = 24 * 3600  # seconds after which another fingerprint's directory is removed


def _store_root() -> str | None:
    named = os.environ.get("GPUFLEET_MODULE_CACHE", "")
    if named == "off":
        return None
    if named:
        return named
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "gpufleet", "ansible-modules")


def _files(top: str):
    for where, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            yield os.path.join(where, name)


def _collection_parts(collection: str):
    manifest = os.path.join(collection, "MANIFEST.json")
    if os.path.isfile(manifest):
        yield manifest
        return
    for part in ("modules", "module_utils"):
        yield from _files(os.path.join(collection, "plugins", part))


def _sources() -> list[str]:
    """Every file whose change would change a pack: those of each collection ansible-core
    would load (the first of that name on the collection path) and the site's module_utils
    (ansible-core's own are its version)."""
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    loaded: dict[str, str] = {}
    for root in AnsibleCollectionConfig.collection_paths:
        base = os.path.join(root, "ansible_collections")
        if not os.path.isdir(base):
            continue
        for namespace in os.listdir(base):
            top = os.path.join(base, namespace)
            if os.path.isdir(top):
                for name in os.listdir(top):
                    loaded.setdefault(f"{namespace}.{name}", os.path.join(top, name))
    found = [path for _, top in sorted(loaded.items()) for path in _collection_parts(top)]
    for directory in C.DEFAULT_MODULE_UTILS_PATH or []:
        found.extend(_files(directory))
    return found


def fingerprint() -> str:
    """Each source's path, size, mtime and ctime, as the runner's project_fingerprint
    (runner/desired.py) has them: a copy that keeps the mtime still sets the ctime. (This
    runs inside ansible-playbook, where the runner's package need not be importable.)"""
    digest = hashlib.sha256(f"{ANSIBLE_VERSION}\0{sys.version_info[:2]}\0".encode())
    for path in _sources():
        stat = os.stat(path)
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ctime_ns}\0".encode())
    return digest.hexdigest()[:20]


def _kept(name: str) -> bool:
    return name.startswith(KEPT) and not name.endswith((".lock", "-part"))


def _private(path: str) -> bool:
    """Whether only this user may write to `path` (a directory it owns)."""
    stat = os.stat(path)
    return stat.st_uid == os.getuid() and not stat.st_mode & 0o022


def _prune(root: str, current: str) -> None:
    now = time.time()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name != current and os.path.isdir(path) and now - os.stat(path).st_mtime > UNUSED_FOR:
            shutil.rmtree(path, ignore_errors=True)


def _lend(store: str, run_cache: str) -> None:
    os.makedirs(run_cache, exist_ok=True)
    for name in os.listdir(store):
        if _kept(name):
            os.symlink(os.path.join(store, name), os.path.join(run_cache, name))


def _keep(store: str, run_cache: str) -> None:
    """Copy the packs this run made into the store (each whole, or not at all)."""
    for name in os.listdir(run_cache):
        path = os.path.join(run_cache, name)
        if not _kept(name) or os.path.islink(path) or os.path.exists(os.path.join(store, name)):
            continue
        handle, part = tempfile.mkstemp(dir=store, prefix=".part-")
        os.close(handle)
        shutil.copyfile(path, part)
        os.replace(part, os.path.join(store, name))


def _quietly(action, *args) -> None:
    with contextlib.suppress(OSError):
        action(*args)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet_module_cache"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Callbacks are loaded in ansible-playbook's own process before the first task,
        # so every worker forked for a task finds the lent packs.
        root = _store_root()
        if root is None:
            return
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
            if not _private(root):
                return
            current = fingerprint()
            store = os.path.join(root, current)
            os.makedirs(store, mode=0o700, exist_ok=True)
            if not _private(store):
                return
            os.utime(store)
            _prune(root, current)
            run_cache = os.path.join(C.DEFAULT_LOCAL_TMP, RUN_CACHE)
            _lend(store, run_cache)
        except OSError:
            return
        # Before ansible-core removes its temporary directory (its handler was
        # registered first, so it runs last).
        atexit.register(_quietly, _keep, store, run_cache)
