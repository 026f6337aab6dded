# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The licence as a user meets it: the GPL's text at the top of the repository and in the
collection, the same identifier in every place a packager reads one, and a header naming
it in every source file."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parents[2]
COLLECTION = PROJECT / "collections" / "ansible_collections" / "gpufleet" / "nvidia"
SPDX = "GPL-3.0-or-later"

# Files whose bytes key a cached build of the simulation (the node image, the package
# repository, the Go programs): a header added there rebuilds that cache, so they get
# theirs with the next change that rebuilds it anyway.
CACHE_KEYS = (
    "tests/sim/kit/",
    "tests/sim/nvml/",
    "tests/sim/repo/",
    "tests/sim/image/build-rootfs.sh",
    "tests/sim/toolkit/build.sh",
    "tests/sim/migparted/build.sh",
    "tests/sim/controlplane/build.sh",
)


def tracked(*patterns: str) -> list[str]:
    listing = subprocess.run(
        ["git", "ls-files", *patterns], cwd=PROJECT, capture_output=True, text=True, check=True
    )
    return listing.stdout.split()


def test_the_licence_text_is_the_gpl_version_3_in_the_repository_and_the_collection():
    text = (PROJECT / "LICENSE").read_text()
    assert text.split()[:4] == ["GNU", "GENERAL", "PUBLIC", "LICENSE"]
    assert "Version 3, 29 June 2007" in text.splitlines()[1]
    # The collection is built (and copied by ansible-builder) from its own directory: it
    # carries the text itself, as COPYING, not as a link out of it.
    assert (COLLECTION / "COPYING").read_text() == text


def test_every_manifest_declares_the_same_licence():
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    assert project["license"] == SPDX
    assert project["license-files"] == ["LICENSE"]
    galaxy = yaml.safe_load((COLLECTION / "galaxy.yml").read_text())
    assert galaxy["license"] == [SPDX]
    for meta in sorted(PROJECT.glob("roles/*/meta/main.yml")):
        info = yaml.safe_load(meta.read_text())["galaxy_info"]
        assert info["license"] == SPDX, meta


def test_every_source_file_names_the_licence_at_its_top():
    missing = []
    for name in tracked("*.py", "*.sh"):
        if name.startswith(CACHE_KEYS):
            continue
        head = (PROJECT / name).read_text().splitlines()[:5]
        if f"# SPDX-License-Identifier: {SPDX}" not in head:
            missing.append(name)
    assert not missing, f"no SPDX line in the first lines of {missing}"


def test_the_collections_plugins_carry_the_header_ansible_test_looks_for():
    # validate-modules wants "GNU General Public License" and "v3.0" in a module's first
    # 20 lines; the collection's other plugins say the same.
    for path in sorted((COLLECTION / "plugins").rglob("*.py")):
        head = "\n".join(path.read_text().splitlines()[:20])
        assert "# GNU General Public License v3.0+" in head, path
