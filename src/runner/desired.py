# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""A host's desired state as a hash: the project's playbooks, roles and collection
(what runs) with the host's variables. A host whose hash differs from the one its
last apply recorded is due for a plan."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# What the project's playbooks and roles are made of: their hash is part of every
# host's desired state, so editing a role makes every host due for a plan.
# The same in a checkout and in the installed package (runner/project): the collection,
# not the execution environment's build files beside it.
PROJECT_PARTS = (
    "site.yml",
    "playbooks",
    "roles",
    "collections/ansible_collections",
    "ansible.cfg",
)


def project_files(root: Path) -> list[Path]:
    """Every file the playbooks run (roles, collection, playbooks), in hashing order;
    not their documentation, the collection's changelog or the playbooks' callback
    plugins, which change nothing on a node (editing a role's README must not re-plan
    the fleet)."""
    files: list[Path] = []
    for part in PROJECT_PARTS:
        base = root / part
        paths = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        files.extend(
            path
            for path in paths
            if not {"__pycache__", "changelogs", "callback_plugins"} & set(path.parts)
            and path.suffix not in (".md", ".rst")
        )
    return files


def project_hash(root: Path, files: Iterable[Path] | None = None) -> str:
    """A hash of the project's `files` (default: project_files(root))."""
    digest = hashlib.sha256()
    for path in project_files(root) if files is None else files:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def project_fingerprint(files: Iterable[Path]) -> tuple[tuple[str, int, int, int], ...]:
    """What changes when a project file is edited, added or removed, without reading
    any: each file's path, size, mtime and ctime (a copy that keeps the mtime, such as
    rsync -t or cp -p, still sets the ctime)."""
    found = []
    for path in files:
        stat = path.stat()
        found.append((str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns))
    return tuple(found)


def desired_hash(project: str, hostvars: Mapping[str, Any]) -> str:
    text = json.dumps(hostvars, sort_keys=True, default=str)
    return hashlib.sha256(f"{project}\0{text}".encode()).hexdigest()
