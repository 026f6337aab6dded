# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The AWX / Automation Platform execution environment: `ansible-builder create` turns
collections/execution-environment.yml into a build context (building the image needs a
registry, so the context is what is checked). It must carry the collections the roles
use, gpufleet.nvidia whole, and pyproject.toml's pins."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COLLECTION = PROJECT / "collections" / "ansible_collections" / "gpufleet" / "nvidia"


def run(*args: str, cwd: Path) -> str:
    result = subprocess.run(args, capture_output=True, text=True, cwd=cwd, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("ee")
    definition = PROJECT / "collections" / "execution-environment.yml"
    run(str(BIN / "ansible-builder"), "create", "-f", str(definition), "-c", "context", cwd=work)
    return work / "context"


def pins() -> dict[str, str]:
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    return dict(d.split("==") for d in project["dependencies"])


def test_the_image_installs_pyprojects_ansible_and_python_packages(context: Path):
    containerfile = (context / "Containerfile").read_text()
    wanted = pins()
    refs = re.search(r'ARG ANSIBLE_INSTALL_REFS="([^"]*)"', containerfile)
    assert refs, containerfile
    assert set(refs.group(1).split()) == {
        f"ansible-core=={wanted['ansible-core']}",
        f"ansible-runner=={wanted['ansible-runner']}",
    }
    python = (context / "_build" / "requirements.txt").read_text().split()
    assert f"kubernetes=={wanted['kubernetes']}" in python
    assert f"PyYAML=={wanted['PyYAML']}" in python
    # ansible-core 2.19 needs Python 3.11 or newer
    version = re.search(r'ARG PYCMD="/usr/bin/python3\.(\d+)"', containerfile)
    assert version and int(version.group(1)) >= 11, containerfile


def test_the_roles_collections_and_ours_are_installed(context: Path, tmp_path: Path):
    requirements = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    assert requirements == yaml.safe_load(
        (PROJECT / "collections" / "requirements.yml").read_text()
    )
    containerfile = (context / "Containerfile").read_text()
    galaxy_stage = containerfile.split("FROM base AS galaxy")[1].split("FROM base AS builder")[0]
    assert "ansible-galaxy collection build /build/gpufleet-nvidia" in galaxy_stage
    # What the galaxy stage builds from is the whole collection: build it the same way.
    run(
        str(BIN / "ansible-galaxy"),
        "collection",
        "build",
        str(context / "_build" / "gpufleet-nvidia"),
        "--output-path",
        str(tmp_path),
        cwd=tmp_path,
    )
    version = yaml.safe_load((COLLECTION / "galaxy.yml").read_text())["version"]
    tarball = tmp_path / f"gpufleet-nvidia-{version}.tar.gz"
    listing = run("tar", "-tzf", str(tarball), cwd=tmp_path)
    ours = sorted(
        str(path.relative_to(COLLECTION))
        for path in (COLLECTION / "plugins").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )
    missing = [name for name in ours if name not in listing.split()]
    assert not missing, missing


def test_the_base_image_is_a_release_not_latest():
    definition = yaml.safe_load((PROJECT / "collections" / "execution-environment.yml").read_text())
    image = definition["images"]["base_image"]["name"]
    name, _, tag = image.rpartition(":")
    assert name.startswith("registry.access.redhat.com/ubi9/"), image
    # A minor release of UBI 9 from 9.4 on (the first with python3.12), or a digest.
    assert "@sha256:" in image or re.fullmatch(r"9\.([4-9]|\d\d)(-\d+)?", tag), image
