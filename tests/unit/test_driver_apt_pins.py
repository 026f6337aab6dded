# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The driver role's apt preferences, as apt itself reads them.

A distro-driver node with NVIDIA's CUDA repository among its sources (added by the
exporter role for DCGM, by the driver role for the fabric manager, or by the site for
CUDA): that repository carries packages of the distribution's driver names at newer
versions, which apt would otherwise take for the driver's set. The role's rendered
preference file, with its version pin beside it, is handed to the real apt on two
small repositories (the distribution's from a directory, NVIDIA's over HTTP, so that
the default selector, the repository's host, tells them apart).
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest
from test_driver_plan import facts

from ansible_collections.gpufleet.nvidia.plugins.filter.driver import driver_plan

TEMPLATES = Path(__file__).resolve().parents[2] / "roles" / "driver" / "templates"

DISTRIBUTION = {
    "nvidia-smi": "535.261.03-1~deb12u1",
    "libnvidia-ml1": "535.261.03-1~deb12u1",
    "libcuda1": "535.261.03-1~deb12u1",
    "nvidia-persistenced": "535.171.04-1",
}
NVIDIA = {
    "nvidia-smi": "580.95.05-1",
    "libnvidia-ml1": "580.95.05-1",
    "libcuda1": "580.95.05-1",
    "nvidia-persistenced": "580.95.05-1",
    "nvidia-fabricmanager-535": "535.261.03-1",
    "datacenter-gpu-manager": "1:3.3.9",
    "cuda-toolkit-12-8": "12.8.1-1",
}


def flat_repository(directory: Path, packages: dict[str, str], label: str) -> None:
    directory.mkdir()
    index = "".join(
        f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
        f"Maintainer: test <test@example.org>\nFilename: pool/{name}.deb\nSize: 1\n"
        f"SHA256: {'0' * 64}\nDescription: {name}\n\n"
        for name, version in packages.items()
    )
    (directory / "Packages").write_text(index)
    digest = hashlib.sha256(index.encode()).hexdigest()
    (directory / "Release").write_text(
        f"Label: {label}\nArchitectures: amd64\nDate: Tue, 01 Dec 2026 00:00:00 UTC\n"
        f"SHA256:\n {digest} {len(index.encode())} Packages\n"
    )


@pytest.fixture(scope="module")
def nvidia_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """NVIDIA's repository, served over HTTP on this machine."""
    served = tmp_path_factory.mktemp("served")
    flat_repository(served / "cuda", NVIDIA, "NVIDIA CUDA")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=served)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def preferences(plan: dict, selector: str = "") -> dict[str, str]:
    """The role's preference files for `plan` (the lookup renders with trim_blocks)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True)
    context = {"_driver_plan": plan, "driver_cuda_repo_apt_selector": selector}
    context["ansible_managed"] = "Managed by gpufleet"
    files = {}
    if plan["apt_pin"] is not None:
        files["gpufleet-nvidia-driver.pref"] = env.get_template("apt-pin.pref.j2").render(context)
    if plan["cuda_repo_pin"] is not None:
        files["gpufleet-nvidia-cuda-repo.pref"] = env.get_template("apt-cuda-repo.pref.j2").render(
            context
        )
    return files


def candidates(tmp: Path, nvidia_url: str, prefs: dict[str, str]) -> dict[str, str]:
    """apt's candidate version of each package, with `prefs` in preferences.d."""
    flat_repository(tmp / "debian", DISTRIBUTION, "Debian")
    for part in ("parts", "prefs", "lists/partial", "cache/archives/partial"):
        (tmp / part).mkdir(parents=True)
    (tmp / "status").write_text("")
    (tmp / "sources.list").write_text(
        f"deb [trusted=yes] file:{tmp / 'debian'} ./\ndeb [trusted=yes] {nvidia_url}/cuda ./\n"
    )
    for name, text in prefs.items():
        (tmp / "prefs" / name).write_text(text)
    options = [
        f"-oDir::Etc::sourcelist={tmp / 'sources.list'}",
        f"-oDir::Etc::sourceparts={tmp / 'parts'}",
        "-oDir::Etc::preferences=/dev/null",
        f"-oDir::Etc::preferencesparts={tmp / 'prefs'}",
        f"-oDir::State::lists={tmp / 'lists'}",
        f"-oDir::State::status={tmp / 'status'}",
        f"-oDir::Cache={tmp / 'cache'}",
        "-oDebug::NoLocking=1",
        "-oAPT::Sandbox::User=root",
        "-oAPT::Architecture=amd64",
        "-oAcquire::Languages=none",
    ]
    subprocess.run(["apt-get", *options, "update"], check=True, capture_output=True)
    policy = subprocess.run(
        ["apt-cache", *options, "policy", *NVIDIA],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found, package = {}, ""
    for line in policy.splitlines():
        if not line.startswith(" "):
            package = line.rstrip(":")
        elif line.strip().startswith("Candidate:"):
            found[package] = line.split(":", 1)[1].strip()
    return found


def debian12(nvidia_url: str, nvswitches: int = 0, version: str = "") -> dict:
    node = facts("debian", "12", compute=(7, 5), nvswitches=nvswitches)
    return driver_plan(node, branch="535", version=version, cuda_repo_base_url=nvidia_url)


def test_without_the_restriction_nvidias_driver_packages_would_win(tmp_path, nvidia_url):
    """What the restriction is for: the newer versions are apt's candidates."""
    assert candidates(tmp_path, nvidia_url, {})["nvidia-smi"] == "580.95.05-1"


def test_a_distro_driver_node_takes_none_of_the_driver_from_nvidias_repository(
    tmp_path, nvidia_url
):
    """With no version pin (the branch's newest) and no fabric manager, the driver set
    comes from the distribution; DCGM and CUDA stay where the site takes them."""
    plan = debian12(nvidia_url)
    # The role adds no source of NVIDIA's here; another role or the site did.
    assert not [r for r in plan["repositories"] if r["uris"][0].startswith(nvidia_url)]
    found = candidates(tmp_path, nvidia_url, preferences(plan))
    assert {name: found[name] for name in DISTRIBUTION} == DISTRIBUTION
    assert found["datacenter-gpu-manager"] == NVIDIA["datacenter-gpu-manager"]
    assert found["cuda-toolkit-12-8"] == NVIDIA["cuda-toolkit-12-8"]
    assert found["nvidia-fabricmanager-535"] == "(none)"


def test_an_nvswitch_node_takes_only_the_fabric_manager_from_it(tmp_path, nvidia_url):
    """The version pin and the restriction together: the pinned version from the
    distribution, the fabric manager from NVIDIA's repository."""
    plan = debian12(nvidia_url, nvswitches=4, version="535.261.03")
    prefs = preferences(plan)
    assert set(prefs) == {"gpufleet-nvidia-driver.pref", "gpufleet-nvidia-cuda-repo.pref"}
    found = candidates(tmp_path, nvidia_url, prefs)
    assert found["nvidia-smi"] == DISTRIBUTION["nvidia-smi"]
    assert found["libcuda1"] == DISTRIBUTION["libcuda1"]
    assert found["nvidia-fabricmanager-535"] == NVIDIA["nvidia-fabricmanager-535"]
    assert found["cuda-toolkit-12-8"] == NVIDIA["cuda-toolkit-12-8"]


def test_a_site_selector_names_the_repository(tmp_path, nvidia_url):
    """driver_cuda_repo_apt_selector, for a mirror on a host shared with other sources
    (the label in its Release file)."""
    prefs = preferences(debian12(nvidia_url), selector="release l=NVIDIA CUDA")
    assert "Pin: release l=NVIDIA CUDA" in prefs["gpufleet-nvidia-cuda-repo.pref"]
    assert candidates(tmp_path, nvidia_url, prefs)["libnvidia-ml1"] == DISTRIBUTION["libnvidia-ml1"]


def test_a_cuda_repository_driver_node_has_no_restriction(nvidia_url):
    node = facts("debian", "12")
    plan = driver_plan(node, branch="580", source="cuda-repo", cuda_repo_base_url=nvidia_url)
    assert plan["cuda_repo_pin"] is None
