# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""dpkg_query and dpkg_installed: a role leaves its apt task out only where dpkg has
every package installed whole at the version named. Read from the real dpkg-query of
this machine, and from listings in its format for the states a node can be left in.
apt_offered: a role refreshes apt's lists where they offer no version of its package,
read from this machine's real apt-cache. dpkg_foreign: a role installs no package over a
file of another origin, read from this machine's real dpkg-query."""

from __future__ import annotations

import subprocess

import pytest

from ansible_collections.gpufleet.nvidia.plugins.filter.packages import (
    apt_offered,
    dpkg_foreign,
    dpkg_installed,
    dpkg_query,
)


def _listing(names):
    run = subprocess.run(dpkg_query(names), capture_output=True, text=True, check=False)
    return run.returncode, run.stdout


def test_what_dpkg_has_installed_is_read_from_dpkg_query_itself():
    rc, listing = _listing(["dpkg", "bash"])
    assert rc == 0 and listing.count("\n") == 2  # a line each, in dpkg's own order
    version = dict(line.split(" ", 1) for line in listing.splitlines())["dpkg"][3:]
    assert dpkg_installed(listing, ["dpkg", "bash"])
    assert dpkg_installed(listing, [f"dpkg={version}", "bash"])
    assert not dpkg_installed(listing, [f"dpkg={version}.1", "bash"])  # another version


def test_a_package_dpkg_does_not_know_sends_the_task_to_apt():
    rc, listing = _listing(["dpkg", "gpufleet-no-such-package"])
    assert rc == 1  # (the roles read it with failed_when: false)
    assert not dpkg_installed(listing, ["dpkg", "gpufleet-no-such-package"])


@pytest.mark.parametrize(
    ("listing", "installed"),
    [
        ("containerd ii 1.6.20~ds1-1+b1\npython3-tomlkit hi 0.11.7-1\n", True),
        ("containerd iF 1.6.20~ds1-1+b1\npython3-tomlkit ii 0.11.7-1\n", False),
        ("containerd iU 1.6.20~ds1-1+b1\npython3-tomlkit ii 0.11.7-1\n", False),
        ("containerd rc 1.6.20~ds1-1+b1\npython3-tomlkit ii 0.11.7-1\n", False),
        ("containerd iiR1.6.20~ds1-1+b1\npython3-tomlkit ii 0.11.7-1\n", False),
        ("python3-tomlkit ii 0.11.7-1\n", False),  # containerd missing
        ("", False),
    ],
)
def test_only_packages_installed_whole_are_left_to_dpkg(listing, installed):
    """ii and hi: installed (held or not); iF half-configured, iU unpacked, rc removed
    with its configuration left, R: reinstallation required."""
    assert dpkg_installed(listing, ["containerd", "python3-tomlkit"]) is installed


def test_a_version_or_an_architecture_in_the_name_is_read_as_apt_reads_it():
    listing = "datacenter-gpu-manager ii 1:3.3.9\ndcgm-exporter ii 3.3.9-3.6.1-1\n"
    assert dpkg_query(["datacenter-gpu-manager", "dcgm-exporter=3.3.9-3.6.1-1"])[3:] == [
        "datacenter-gpu-manager",
        "dcgm-exporter",
    ]
    assert dpkg_installed(listing, ["datacenter-gpu-manager", "dcgm-exporter=3.3.9-3.6.1-1"])
    assert not dpkg_installed(listing, ["datacenter-gpu-manager", "dcgm-exporter=3.3.8-3.6.0-1"])
    assert dpkg_installed("libc6 ii 2.36-9\n", ["libc6:amd64"])
    assert not dpkg_installed(listing, [])


def _policy(name):
    return subprocess.run(
        ["apt-cache", "policy", name], capture_output=True, text=True, check=True
    ).stdout


def test_a_package_apt_can_install_is_offered_and_one_its_lists_lack_is_not():
    assert apt_offered(_policy("dpkg"), "dpkg")  # installed: at least that version
    # The lists of a repository whose refresh never finished: apt knows no such name.
    assert _policy("gpufleet-no-such-package") == ""
    assert not apt_offered("", "gpufleet-no-such-package")
    assert not apt_offered(_policy("dpkg"), "nvidia-kernel-dkms")  # another package


def test_a_package_apt_knows_with_no_candidate_is_not_offered():
    # apt knows the name (another package depends on it) but no source carries it.
    policy = "nvidia-kernel-dkms:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n"
    assert not apt_offered(policy, "nvidia-kernel-dkms")


def _search(*paths):
    run = subprocess.run(["dpkg-query", "--search", *paths], capture_output=True, text=True)
    return run.stdout


def test_files_of_another_origin_are_named_with_their_packages_from_dpkg_itself(tmp_path):
    """dpkg_foreign: the exporter role refuses to install over a DCGM or dcgm-exporter
    of another origin. Read from this machine's real dpkg-query: a file its package
    owns is not foreign, one another package owns is (with that package), one no
    package owns is (with none)."""
    mine, theirs, loose = "/usr/bin/dpkg", "/bin/bash", str(tmp_path / "dcgm-exporter")
    (tmp_path / "dcgm-exporter").write_text("#!/bin/sh\n")
    programs = {mine: "dpkg=1.0", theirs: "datacenter-gpu-manager-exporter", loose: "x"}
    search = _search(mine, theirs, loose)
    assert dpkg_foreign(search, programs, [mine]) == {}
    assert dpkg_foreign(search, programs, [mine, theirs, loose]) == {theirs: ["bash"], loose: []}
    assert dpkg_foreign("", programs, []) == {}


def test_a_diversion_owns_nothing_and_an_architecture_is_left_out():
    search = (
        "diversion by gpufleet from: /usr/bin/dcgm-exporter\n"
        "diversion by gpufleet to: /usr/bin/dcgm-exporter.real\n"
        "dcgm-exporter:amd64, other: /usr/bin/dcgm-exporter\n"
    )
    path = "/usr/bin/dcgm-exporter"
    wanted = {path: "datacenter-gpu-manager-exporter"}
    assert dpkg_foreign(search, wanted, [path]) == {path: ["dcgm-exporter", "other"]}
    assert dpkg_foreign(search, {path: "other"}, [path]) == {}
