# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""A simulated node's bytecode cache for Ansible's module payloads (test fleet only).

Ansible runs each module from a zip it writes to a new temporary directory. Python's
zipimport compiles every module it imports from a zip, on every run, and in CPython
3.11 twice: once to name the module's file (get_filename, called as the module's
spec is made) and once to run it. On a simulated node that is about half of a
module's start (0.15 of 0.3 CPU-s for ansible.module_utils.basic here).

This hook, loaded at Python's start by gpusim-pyc.pth, names the file from the zip's
table of contents and keeps the compiled code of a payload's modules under
/var/cache/gpusim/pyc, keyed by the module's name, its source and the interpreter's
cache tag, so a changed source is compiled afresh. Only archives named as Ansible
names its payloads (ansible_<module>_payload.zip) are served; for anything else, or
anything unexpected, zipimport's own code runs. Nothing of a module's behaviour
changes. Real hosts have no such cache, and gpufleet's roles neither know nor need it.
"""

from __future__ import annotations

import _imp
import marshal
import os
import sys
import zipimport

CACHE = "/var/cache/gpusim/pyc"


class PayloadImporter(zipimport.zipimporter):
    def _payload(self) -> bool:
        name = os.path.basename(self.archive)
        return name.startswith("ansible_") and name.endswith("_payload.zip")

    def get_filename(self, fullname):
        if self._payload():
            try:
                files = self._get_files() if hasattr(self, "_get_files") else self._files
                path = zipimport._get_module_path(self, fullname)
                for suffix, bytecode, _package in zipimport._zip_searchorder:
                    entry = files.get(path + suffix)
                    if entry is not None and not bytecode:
                        return entry[0]
                    if entry is not None:
                        break
            except AttributeError:  # another CPython's zipimport: its own way
                pass
        return super().get_filename(fullname)

    def get_code(self, fullname):
        source = self.get_source(fullname) if self._payload() else None
        if source is None:
            return super().get_code(fullname)
        import hashlib

        key = f"{sys.implementation.cache_tag}\0{fullname}\0{source}"
        path = os.path.join(CACHE, hashlib.sha256(key.encode()).hexdigest())
        try:
            with open(path, "rb") as cached:
                code = marshal.loads(cached.read())
        except (OSError, ValueError, EOFError, TypeError):
            code = super().get_code(fullname)
            try:
                os.makedirs(CACHE, exist_ok=True)
                partial = f"{path}.{os.getpid()}"
                with open(partial, "wb") as out:
                    out.write(marshal.dumps(code))
                os.replace(partial, path)
            except OSError:
                pass
            return code
        # The cached code names the payload of the run that compiled it.
        _imp._fix_co_filename(code, self.get_filename(fullname))
        return code


def install() -> None:
    for index, hook in enumerate(sys.path_hooks):
        if hook is zipimport.zipimporter:
            sys.path_hooks[index] = PayloadImporter
            sys.path_importer_cache.clear()
            return
