# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""apt_set's reading of apt's own output (fixtures/apt/README.md says where from)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import apt_set
from conftest import FIXTURES

APT = FIXTURES / "apt"
HELD = ["nvidia-kernel-dkms", "nvidia-smi", "nvidia-fabricmanager-535"]
# The real output of a downgrade of the fabric manager alone (stand-in repository).
DOWNGRADE = """\
The following held packages will be changed:
  nvidia-fabricmanager-535
The following packages will be DOWNGRADED:
  nvidia-fabricmanager-535
0 upgraded, 0 newly installed, 1 downgraded, 0 to remove and 16 not upgraded.
Inst nvidia-fabricmanager-535 [535.309.01-1] (535.261.03-1 gpufleet-standin-cuda:localhost [amd64])
Conf nvidia-fabricmanager-535 (535.261.03-1 gpufleet-standin-cuda:localhost [amd64])
"""


@pytest.fixture(scope="module")
def policy():
    return apt_set.parse_policy((APT / "policy-debian12-h100.txt").read_text())


def test_policy_lists_each_package_with_its_versions_and_priorities(policy):
    assert set(policy) == {*HELD, "nvidia-persistenced"}
    smi = policy["nvidia-smi"]
    assert (smi["installed"], smi["candidate"]) == ("535.261.03-1", "535.261.03-1")
    assert smi["versions"] == [
        ("580.95.05-1", -1),
        ("535.309.01-0+deb12u1", 500),
        ("535.261.03-1", 1001),
    ]


def test_only_installed_packages_are_removed_not_those_apt_lacks_or_does_not_know(policy):
    # (apt-cache policy prints nothing for a name no source knows; apt-get refuses
    # to remove such a name, so it is passed over)
    not_installed = apt_set.parse_policy(
        "nvidia-open-kernel-dkms:\n  Installed: (none)\n  Candidate: 535.261.03-1\n"
    )
    both = {**policy, **not_installed}
    names = ["nvidia-fabricmanager-535", "nvidia-open-kernel-dkms", "nvidia-fabricmanager-550"]
    assert apt_set.installed(both, names) == ["nvidia-fabricmanager-535"]


@pytest.mark.parametrize(
    ("version", "upstream"),
    [
        ("535.309.01-0+deb12u1", "535.309.01"),
        ("1:3.3.9", "3.3.9"),
        ("3.3.9-3.6.1-1", "3.3.9-3.6.1"),
    ],
)
def test_upstream_drops_epoch_and_revision(version, upstream):
    assert apt_set.upstream(version) == upstream


def test_the_set_is_pinned_to_exact_versions_whatever_each_revision(policy):
    arguments = apt_set.specs(policy, [*HELD, "nvidia-persistenced"], HELD, "535.309.01")
    assert arguments == [
        "nvidia-kernel-dkms=535.309.01-0+deb12u1",
        "nvidia-smi=535.309.01-0+deb12u1",
        "nvidia-fabricmanager-535=535.309.01-1",
        "nvidia-persistenced",  # its own source package and version
    ]


def test_a_version_a_pin_forbids_is_not_taken(policy):
    """The stand-in repository's 580 build is pinned to -1 on a distro-driver node."""
    with pytest.raises(apt_set.AptSetError) as error:
        apt_set.specs(policy, ["nvidia-smi"], ["nvidia-smi"], "580.95.05")
    assert str(error.value) == (
        "not available from the node's package sources: nvidia-smi 580.95.05 "
        "(they offer 535.309.01-0+deb12u1, 535.261.03-1)"
    )


def test_every_package_missing_at_the_version_is_named_at_once(policy):
    with pytest.raises(apt_set.AptSetError) as error:
        apt_set.specs(policy, HELD, HELD, "535.999.99")
    message = str(error.value)
    for name in HELD:
        assert f"{name} 535.999.99 (they offer" in message


def test_without_a_version_the_first_packages_candidate_sets_it(policy):
    assert apt_set.target_version(policy, "", HELD) == "535.261.03"
    assert apt_set.target_version(policy, "535.309.01", HELD) == "535.309.01"
    with pytest.raises(apt_set.AptSetError, match="nvidia-driver-999 is not available"):
        apt_set.target_version(policy, "", ["nvidia-driver-999"])


def test_a_simulated_upgrade_lists_every_package_it_moves():
    steps = apt_set.parse_simulation((APT / "simulate-upgrade.txt").read_text())
    assert len(steps) == 12
    assert {step["action"] for step in steps} == {"upgrade"}
    fm = next(step for step in steps if step["name"] == "nvidia-fabricmanager-535")
    assert (fm["from"], fm["to"]) == ("535.261.03-1", "535.309.01-1")
    # Dependencies the set pulls along are part of the transaction too.
    assert "nvidia-alternative" in {step["name"] for step in steps}


def test_a_simulated_downgrade_is_called_one():
    steps = apt_set.parse_simulation(DOWNGRADE)
    assert steps == [
        {
            "name": "nvidia-fabricmanager-535",
            "action": "downgrade",
            "from": "535.309.01-1",
            "to": "535.261.03-1",
        }
    ]
    assert apt_set.summary(steps) == "downgrade nvidia-fabricmanager-535"


def test_installs_and_removals_are_told_apart():
    steps = apt_set.parse_simulation(
        "Remv nvidia-kernel-dkms [535.261.03-1]\n"
        "Inst nvidia-open-kernel-dkms (535.261.03-1 Debian:12.12/oldstable [amd64])\n"
    )
    assert [step["action"] for step in steps] == ["remove", "install"]
    assert apt_set.summary(steps) == "remove nvidia-kernel-dkms; install nvidia-open-kernel-dkms"


def test_a_refusal_keeps_apts_reasons_and_drops_its_boilerplate():
    said = apt_set.refusal((APT / "simulate-unmet.txt").read_text())
    assert said == (
        "nvidia-smi : Depends: nvidia-alternative (= 535.309.01-0+deb12u1) but 535.261.03-1 "
        "is to be installed; Depends: libnvidia-ml1 (= 535.309.01-0+deb12u1) but "
        "535.261.03-1 is to be installed; E: Unable to correct problems, you have held "
        "broken packages."
    )


def test_the_undo_puts_back_each_version_and_removes_what_was_new():
    steps = apt_set.parse_simulation(
        DOWNGRADE
        + "Remv nvidia-kernel-dkms [535.309.01-1]\n"
        + "Inst nvidia-open-kernel-dkms (535.261.03-1 Debian:12.12/oldstable [amd64])\n"
    )
    assert apt_set.undo(steps, held=["nvidia-fabricmanager-535", "nvidia-smi"]) == {
        "install": ["nvidia-fabricmanager-535=535.309.01-1", "nvidia-kernel-dkms=535.309.01-1"],
        "remove": ["nvidia-open-kernel-dkms"],
        "hold": ["nvidia-fabricmanager-535"],
    }


def test_a_failed_install_says_which_script_failed_and_why():
    """What apt-get printed when DKMS's hook failed (from a simulated node)."""
    out = (
        "Setting up nvidia-kernel-dkms (535.309.01-0+deb12u1) ...\n"
        "Error! Bad return status for module build on kernel: 6.18.44 (x86_64)\n"
        "dpkg: error processing package nvidia-kernel-dkms (--configure):\n"
        " installed nvidia-kernel-dkms package post-installation script subprocess "
        "returned error exit status 10\n"
        "Errors were encountered while processing:\n"
        " nvidia-kernel-dkms\n"
        "E: Sub-process /usr/bin/dpkg returned an error code (1)\n"
    )
    assert apt_set.refusal(out) == (
        "Error! Bad return status for module build on kernel: 6.18.44 (x86_64); "
        "dpkg: error processing package nvidia-kernel-dkms (--configure):; "
        "installed nvidia-kernel-dkms package post-installation script subprocess "
        "returned error exit status 10; E: Sub-process /usr/bin/dpkg returned an error code (1)"
    )


def test_a_package_left_unconfigured_is_finished_by_the_transaction():
    """What --simulate says with nvidia-kernel-dkms half-configured by a failed run."""
    steps = apt_set.parse_simulation(
        "1 not fully installed or removed.\n"
        "Conf nvidia-kernel-dkms (535.309.01-0+deb12u1 Debian-Security:12/oldstable-security "
        "[amd64])\n"
    )
    assert steps == [
        {
            "name": "nvidia-kernel-dkms",
            "action": "configure",
            "from": None,
            "to": "535.309.01-0+deb12u1",
        }
    ]
    assert apt_set.undo(steps)["install"] == []  # nothing of the old set to put back


def test_a_set_installed_at_its_versions_needs_no_transaction(policy):
    """apt-get --simulate is left out only where apt's policy shows nothing to do."""
    exact = ["nvidia-smi=535.261.03-1", "nvidia-kernel-dkms=535.261.03-1"]
    assert apt_set.at_versions(policy, exact)
    assert apt_set.at_versions(policy, ["nvidia-persistenced"])  # installed = candidate
    assert not apt_set.at_versions(policy, ["nvidia-smi=535.309.01-0+deb12u1"])  # a change
    # a bare name whose candidate is newer is an upgrade
    assert not apt_set.at_versions(policy, ["nvidia-fabricmanager-535"])
    assert not apt_set.at_versions(policy, [*exact, "nvidia-fabricmanager-535-"])  # a removal
    assert not apt_set.at_versions(policy, ["nvidia-open-kernel-dkms"])  # apt lacks it
    assert not apt_set.at_versions(policy, [])


@pytest.mark.parametrize(
    ("status", "whole"),
    [
        ("ii \nhi \n", True),  # installed; installed and held
        ("ii \niF \n", False),  # half-configured by a failed run: apt-get finishes it
        ("hi \nrc \n", False),  # removed, its configuration files left
        ("iU \n", False),  # unpacked, not configured
        ("iiR\n", False),  # installed, reinstallation required
        ("", False),
    ],
)
def test_only_packages_dpkg_has_whole_skip_the_transaction(status, whole):
    assert apt_set.whole(status) is whole
