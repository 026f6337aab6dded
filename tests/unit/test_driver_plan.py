# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the driver role would install, and from where, on each supported OS."""

from __future__ import annotations

import fnmatch
import re

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.filter.driver import driver_desired, driver_plan
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_plan as dp

CUDA = "https://developer.download.nvidia.com/compute/cuda/repos"


def facts(os_id: str, version_id: str, compute=(9, 0), nvswitches=0, kernel="6.1.0-18-amd64"):
    return {
        "os": {"id": os_id, "version_id": version_id, "kernel": kernel},
        "gpus": [{"compute_major": compute[0], "compute_minor": compute[1]}],
        "nvswitch_count": nvswitches,
    }


def test_debian12_distro_proprietary_pinned_and_held():
    plan = driver_plan(
        facts("debian", "12"), branch="535", version="535.261.03", cuda_repo_base_url=CUDA
    )
    assert plan["packages"] == [
        "nvidia-kernel-dkms",
        "nvidia-smi",
        "libnvidia-ml1",
        "libcuda1",
        "firmware-nvidia-gsp",
        "nvidia-persistenced",
    ]
    # The version is pinned for these packages and their strict dependencies alike.
    assert plan["apt_pin"]["version"] == "535.261.03-*"
    pinned = plan["apt_pin"]["packages"].split()
    assert any(fnmatch.fnmatchcase("nvidia-alternative", glob) for glob in pinned)
    assert any(fnmatch.fnmatchcase("libcuda1", glob) for glob in pinned)
    assert not any(fnmatch.fnmatchcase("linux-headers-amd64", glob) for glob in pinned)
    assert "nvidia-kernel-dkms" in plan["hold"]
    assert [r["components"] for r in plan["repositories"]] == [
        ["contrib", "non-free", "non-free-firmware"]
    ] * 2
    assert plan["repositories"][1]["uris"] == ["http://deb.debian.org/debian-security"]
    assert plan["headers"] == ["linux-headers-6.1.0-18-amd64"]
    assert plan["fabricmanager"] == []


@pytest.mark.parametrize(
    ("os_id", "version_id", "source"),
    [("debian", "12", "distro"), ("debian", "12", "cuda-repo"), ("ubuntu", "22.04", "distro")],
)
def test_apt_nodes_without_nvswitches_remove_a_fabric_manager_in_the_driver_transaction(
    os_id, version_id, source
):
    plain = driver_plan(
        facts(os_id, version_id), branch="535", cuda_repo_base_url=CUDA, source=source
    )
    assert "nvidia-fabricmanager-535" in plain["remove"]
    hgx = driver_plan(
        facts(os_id, version_id, nvswitches=4), branch="535", cuda_repo_base_url=CUDA, source=source
    )
    assert hgx["fabricmanager"] == ["nvidia-fabricmanager-535"]
    assert not any(name.startswith("nvidia-fabricmanager") for name in hgx["remove"])


def test_debian12_hgx_gets_fabric_manager_from_the_cuda_repo():
    plan = driver_plan(
        facts("debian", "12", nvswitches=4),
        branch="535",
        version="535.261.03",
        cuda_repo_base_url="file:/srv/mirror/cuda",
    )
    assert plan["fabricmanager"] == ["nvidia-fabricmanager-535"]
    cuda = plan["repositories"][-1]
    assert cuda["uris"] == ["file:/srv/mirror/cuda/debian12/x86_64"]
    # The fabric manager, and none of the driver, comes from NVIDIA's repository then.
    assert plan["cuda_repo_pin"]["selector"] == 'origin ""'
    assert plan["cuda_repo_pin"]["allowed"] == "nvidia-fabricmanager-* libnvidia-nscq-*"
    remote = driver_plan(facts("debian", "12", nvswitches=4), branch="535", cuda_repo_base_url=CUDA)
    assert remote["cuda_repo_pin"]["selector"] == 'origin "developer.download.nvidia.com"'
    # Without NVSwitches the role adds no CUDA source, and still keeps the driver off
    # one that another role or the site adds (test_driver_apt_pins: apt's view).
    plain = driver_plan(facts("debian", "12"), branch="535", cuda_repo_base_url=CUDA)
    assert [r["name"] for r in plain["repositories"]] == [
        "zz-gpufleet-debian-nvidia",
        "zz-gpufleet-debian-security-nvidia",
    ]
    assert plain["cuda_repo_pin"]["allowed"] == ""
    assert plain["cuda_repo_pin"]["refused"] == " ".join(dp.DEB_DRIVER_PACKAGE_GLOBS)
    assert cuda["key_url"] == "file:/srv/mirror/cuda/debian12/x86_64/3bf863cc.pub"


def test_debian12_open_modules():
    plan = driver_plan(
        facts("debian", "12"), branch="535", module_type="open", cuda_repo_base_url=CUDA
    )
    assert plan["packages"][0] == "nvidia-open-kernel-dkms"
    assert plan["module_type"] == "open"


def test_debian12_distro_has_only_the_535_branch():
    with pytest.raises(AnsibleFilterError, match="driver_branch: Debian 12 packages only"):
        driver_plan(facts("debian", "12"), branch="550", cuda_repo_base_url=CUDA)


def test_debian13_takes_its_550_branch_from_trixie_and_the_same_package_names():
    plan = driver_plan(
        facts("debian", "13", nvswitches=4, kernel="6.12.48+deb13-amd64"),
        branch="550",
        module_type="open",
        cuda_repo_base_url="file:/srv/mirror/cuda",
    )
    # Debian 13 names the packages as 12 does (nvidia-graphics-drivers 550.163.01).
    assert plan["packages"] == [
        "nvidia-open-kernel-dkms",
        "nvidia-smi",
        "libnvidia-ml1",
        "libcuda1",
        "firmware-nvidia-gsp",
        "nvidia-persistenced",
    ]
    suites = [r["suites"] for r in plan["repositories"]]
    assert suites[:2] == [["trixie", "trixie-updates"], ["trixie-security"]]
    assert plan["repositories"][-1]["uris"] == ["file:/srv/mirror/cuda/debian13/x86_64"]
    assert plan["fabricmanager"] == ["nvidia-fabricmanager-550"]
    assert plan["headers"] == ["linux-headers-6.12.48+deb13-amd64"]
    with pytest.raises(AnsibleFilterError, match="Debian 13 packages only the 550 branch, not 535"):
        driver_plan(facts("debian", "13"), branch="535", cuda_repo_base_url=CUDA)
    with pytest.raises(AnsibleFilterError, match="Debian 11 is not supported"):
        driver_plan(facts("debian", "11"), branch="535", cuda_repo_base_url=CUDA)


@pytest.mark.parametrize("version", ["22.04", "24.04"])
def test_ubuntu_distro_uses_canonical_server_packages(version):
    plan = driver_plan(
        facts("ubuntu", version, kernel="5.15.0-91-generic"),
        branch="550",
        cuda_repo_base_url=CUDA,
        module_type="open",
    )
    assert plan["packages"] == ["nvidia-headless-550-server-open", "nvidia-utils-550-server"]
    assert plan["precompiled"] == {
        "prefix": "linux-modules-nvidia-550-server-open-",
        "kernel_package": "linux-modules-nvidia-550-server-open-5.15.0-91-generic",
        "dkms_package": "nvidia-dkms-550-server-open",
    }
    assert plan["repositories"] == []


def _ubuntu_plan(kernel="6.8.0-45-generic"):
    return driver_plan(
        facts("ubuntu", "22.04", kernel=kernel), branch="535", cuda_repo_base_url=CUDA
    )


def test_ubuntu_hwe_kernel_gets_its_precompiled_signed_modules_and_flavour_metapackage():
    # An HWE kernel: its flavour metapackage is linux-image-generic-hwe-22.04, so
    # the module metapackage that follows its updates is ...-generic-hwe-22.04.
    available = [
        "linux-modules-nvidia-535-server-6.8.0-45-generic",
        "linux-modules-nvidia-535-server-5.15.0-91-generic",
        "linux-modules-nvidia-535-server-generic",
        "linux-modules-nvidia-535-server-generic-hwe-22.04",
    ]
    installed = ["linux-image-6.8.0-45-generic", "linux-image-generic-hwe-22.04"]
    modules = dp.kernel_modules(_ubuntu_plan(), available, installed)
    assert modules == {
        "packages": [
            "linux-modules-nvidia-535-server-6.8.0-45-generic",
            "linux-modules-nvidia-535-server-generic-hwe-22.04",
        ],
        "hold": ["linux-modules-nvidia-535-server-6.8.0-45-generic"],
        "signed": True,
    }


def test_ubuntu_kernel_without_precompiled_modules_falls_back_to_dkms_unsigned():
    available = ["linux-modules-nvidia-535-server-5.15.0-91-generic"]
    modules = dp.kernel_modules(_ubuntu_plan("6.9.3-custom"), available, ["linux-image-generic"])
    assert modules == {
        "packages": ["nvidia-dkms-535-server"],
        "hold": ["nvidia-dkms-535-server"],
        "signed": False,
    }


def test_plans_with_their_own_module_packages_need_no_selection():
    plan = driver_plan(facts("debian", "12"), branch="535", cuda_repo_base_url=CUDA)
    assert dp.kernel_modules(plan, [], []) == {"packages": [], "hold": [], "signed": False}


def test_ubuntu_cuda_repo():
    plan = driver_plan(
        facts("ubuntu", "22.04", nvswitches=4),
        branch="550",
        version="550.127.05",
        source="cuda-repo",
        cuda_repo_base_url=CUDA,
    )
    assert plan["packages"] == ["cuda-drivers-550"]
    assert plan["apt_pin"]["version"] == "550.127.05-*"
    assert plan["repositories"][0]["uris"] == [f"{CUDA}/ubuntu2204/x86_64"]
    assert plan["fabricmanager"] == ["nvidia-fabricmanager-550"]


@pytest.mark.parametrize(
    ("os_id", "version"), [("rocky", "9.4"), ("rhel", "8.10"), ("almalinux", "9.5")]
)
def test_rhel_family_uses_dnf_module_streams(os_id, version):
    plan = driver_plan(
        facts(os_id, version, nvswitches=4, kernel="5.14.0-427.el9.x86_64"),
        branch="535",
        source="cuda-repo",
        cuda_repo_base_url=CUDA,
    )
    major = version.split(".")[0]
    assert plan["module_stream"] == {"name": "nvidia-driver", "stream": "535-dkms"}
    assert plan["packages"] == ["@nvidia-driver:535-dkms"]
    assert plan["repositories"][0]["baseurl"] == f"{CUDA}/rhel{major}/x86_64"
    assert plan["headers"] == [
        "kernel-devel-5.14.0-427.el9.x86_64",
        "kernel-headers-5.14.0-427.el9.x86_64",
    ]
    assert plan["fabricmanager"] == ["nvidia-fabric-manager"]
    assert plan["initramfs_command"] == ["dracut", "-f"]


def test_rhel_exact_version_installs_that_version_from_the_enabled_stream():
    plan = driver_plan(
        facts("rocky", "9.4", compute=(8, 0)),
        branch="550",
        version="550.127.05",
        module_type="open",
        source="cuda-repo",
        cuda_repo_base_url=CUDA,
    )
    assert plan["module_stream"] == {"name": "nvidia-driver", "stream": "550-open"}
    assert plan["packages"] == [
        "nvidia-driver-550.127.05",
        "nvidia-driver-cuda-550.127.05",
        "kmod-nvidia-open-dkms-550.127.05",
    ]


def test_rhel_needs_the_cuda_repo():
    with pytest.raises(AnsibleFilterError, match="driver_source: RHEL-family"):
        driver_plan(facts("rocky", "9.4"), branch="535", cuda_repo_base_url=CUDA)


@pytest.mark.parametrize(
    ("requested", "branch", "compute", "expected"),
    [
        ("auto", "535", (9, 0), "proprietary"),
        ("auto", "570", (9, 0), "open"),
        ("auto", "570", (7, 0), "proprietary"),
        ("auto", "570", (10, 0), "open"),
        ("auto", "535", (12, 0), "open"),
        ("open", "535", (7, 5), "open"),
        ("proprietary", "570", (8, 0), "proprietary"),
    ],
)
def test_module_type_resolution(requested, branch, compute, expected):
    assert dp.resolve_module_type(requested, branch, [compute]) == expected


def test_open_modules_on_volta_fail_naming_the_variable():
    with pytest.raises(
        AnsibleFilterError, match="driver_kernel_module_type: open kernel modules need a Turing"
    ):
        driver_plan(
            facts("debian", "12", compute=(7, 0)),
            branch="535",
            module_type="open",
            cuda_repo_base_url=CUDA,
        )


def test_proprietary_on_blackwell_fails():
    with pytest.raises(AnsibleFilterError, match="Blackwell"):
        driver_plan(
            facts("ubuntu", "24.04", compute=(10, 0)),
            branch="570",
            module_type="proprietary",
            cuda_repo_base_url=CUDA,
        )


@pytest.mark.parametrize(
    ("branch", "version", "message"),
    [
        ("5350", "", "driver_branch: expected a three-digit"),
        ("535", "535.261.03", None),
        ("535", "535.261", "driver_version: expected"),
        ("535", "550.127.05", "is not of driver_branch 535"),
        ("535", "latest", "driver_version: expected"),
    ],
)
def test_branch_and_version_validation(branch, version, message):
    def call():
        return driver_plan(
            facts("debian", "12"),
            branch=branch,
            version=version,
            cuda_repo_base_url=CUDA,
        )

    if message is None:
        assert call()["version"] == version
    else:
        with pytest.raises(AnsibleFilterError, match=message):
            call()


def test_unsupported_os_lists_the_supported_ones():
    with pytest.raises(AnsibleFilterError, match=r"sles 15\.5 is not supported; supported: Debian"):
        driver_plan(facts("sles", "15.5"), branch="535", cuda_repo_base_url=CUDA)


def test_debian_mirrors_are_configurable_separately():
    plan = driver_plan(
        facts("debian", "12"),
        branch="535",
        cuda_repo_base_url=CUDA,
        debian_mirror="http://mirror.example.internal/deb",
        debian_security_mirror="http://mirror.example.internal/deb-sec",
    )
    assert [r["uris"] for r in plan["repositories"]] == [
        ["http://mirror.example.internal/deb"],
        ["http://mirror.example.internal/deb-sec"],
    ]


@pytest.mark.parametrize(
    ("version", "module_type", "pinned", "expected"),
    [
        (None, None, "535.261.03", False),  # no driver: nothing is replaced
        ("535.261.03", "proprietary", "535.261.03", False),
        ("535.261.03", "proprietary", "", False),  # newest of the branch: stays
        ("535.309.01", "proprietary", "535.261.03", True),  # another version
        ("550.127.05", "proprietary", "", True),  # another branch
        ("535.261.03", "open", "535.261.03", True),  # another flavour
    ],
)
def test_a_driver_differs_from_the_plan(version, module_type, pinned, expected):
    plan = driver_plan(
        facts("debian", "12", compute=(7, 5)),
        branch="535",
        version=pinned,
        module_type="proprietary",
        cuda_repo_base_url=CUDA,
    )
    assert dp.differs(version, module_type, plan) is expected


def _gpu(compute, name="NVIDIA B200", device="0x2901"):
    major, minor = compute if compute else (None, None)
    return {
        "pci_address": "0000:1b:00.0",
        "device_id": device,
        "name": name,
        "compute_major": major,
        "compute_minor": minor,
    }


@pytest.mark.parametrize(
    ("compute", "branch", "refusal"),
    [
        (
            (10, 0),
            "535",
            "driver_branch: 535 does not support GPU 0000:1b:00.0 (NVIDIA B200, "
            "device 0x2901): Blackwell GPUs (compute 10.0) need branch 570 or newer",
        ),
        ((12, 0), "565", "Blackwell GPUs (compute 12.0) need branch 570 or newer"),
        ((10, 0), "570", ""),
        ((9, 0), "515", "Hopper GPUs (compute 9.0) need branch 520 or newer"),
        ((9, 0), "535", ""),
        ((8, 9), "535", ""),
        ((8, 6), "450", "Ampere GPUs (compute 8.6) need branch 455 or newer"),
        ((8, 0), "450", ""),
        ((7, 5), "470", ""),
    ],
)
def test_a_branch_too_old_for_a_gpu_is_refused_naming_it(compute, branch, refusal):
    if not refusal:
        dp.check_gpus(branch, "auto", [_gpu(compute)])
        return
    with pytest.raises(dp.PlanError) as raised:
        dp.check_gpus(branch, "auto", [_gpu(compute)])
    assert refusal in str(raised.value)


def test_auto_does_not_guess_the_module_flavour_of_a_gpu_of_unknown_generation():
    unknown = _gpu(None, name="GB202GL [Example Blackwell Board]", device="0x2bb5")
    with pytest.raises(
        AnsibleFilterError,
        match=re.escape(
            "driver_kernel_module_type: auto cannot tell the generation of GPU 0000:1b:00.0 "
            "(GB202GL [Example Blackwell Board], device 0x2bb5), which gpufleet's table does not "
            "know: set open"
        ),
    ):
        driver_plan({**facts("debian", "12"), "gpus": [unknown]}, "535", CUDA)
    # Asked for by name, the flavour is the site's choice.
    plan = driver_plan(
        {**facts("debian", "12"), "gpus": [unknown]}, "535", CUDA, module_type="open"
    )
    assert plan["module_type"] == "open"


# -- which driver: named, adopted from the node, or the default --------------------------

T4 = _gpu((7, 5), name="Tesla T4", device="0x1eb8")
B200 = _gpu((10, 0))


def _driver(version=None, module_type=None, installed_by="package", installed=None, state=None):
    """gpu_facts' driver: `version` loaded (with `module_type`), `installed` by a package."""
    installed = installed or version
    return {
        "state": state or ("loaded" if version else "installed" if installed else "absent"),
        "version": version or installed,
        "module_type": module_type,
        "installed_version": installed if installed_by == "package" else None,
        "installed_module_type": module_type if installed_by == "package" else None,
        "installed_by": installed_by if (version or installed) else None,
    }


def _desired(
    driver, gpus=(T4,), branch="", version="", module_type="auto", manage="auto", offered=()
):
    return dp.desired(branch, version, module_type, manage, driver, list(gpus), list(offered))


def test_a_node_without_a_driver_gets_the_default_branch_fit_for_its_gpus():
    assert _desired(_driver()) == {
        "branch": "535",
        "version": "",
        "module_type": "auto",
        "adopted": False,
        "note": "",
    }
    # Blackwell runs nothing older than 570: the default rises with it.
    assert _desired(_driver(), gpus=[T4, B200])["branch"] == "570"


def test_a_packaged_driver_is_adopted_branch_and_flavour_not_pinned():
    loaded = _driver("550.163.01", "open")
    assert _desired(loaded) == {
        "branch": "550",
        "version": "",  # kept as installed (held), no pin that a later run would write
        "module_type": "open",
        "adopted": True,
        "note": "driver 550.163.01 (open) adopted as installed; "
        "the defaults would install branch 535 (proprietary)",
    }


def test_what_the_defaults_would_install_anyway_is_adopted_without_a_note():
    # A node gpufleet installed with the defaults: adopted, and nothing to say.
    same = _desired(_driver("535.261.03", "proprietary"))
    assert (same["branch"], same["module_type"], same["adopted"], same["note"]) == (
        "535",
        "proprietary",
        True,
        "",
    )


def test_what_the_settings_name_wins_and_the_rest_is_adopted():
    loaded = _driver("535.261.03", "open")
    named_branch = _desired(loaded, branch="550")
    assert (named_branch["branch"], named_branch["module_type"]) == ("550", "open")
    named_version = _desired(loaded, version="535.309.01")
    assert (named_version["branch"], named_version["version"]) == ("535", "535.309.01")
    named_flavour = _desired(loaded, module_type="proprietary")
    assert (named_flavour["branch"], named_flavour["module_type"]) == ("535", "proprietary")
    named = _desired(loaded, branch="535", module_type="open")
    assert named["adopted"] is False


@pytest.mark.parametrize(
    "driver",
    [
        _driver("535.261.03", "proprietary", installed_by="other"),  # a .run installer's
        _driver(),
    ],
    ids=["not-from-packages", "none"],
)
def test_only_a_driver_from_packages_is_adopted(driver):
    assert _desired(driver)["adopted"] is False


def test_always_takes_over_with_the_defaults():
    taken = _desired(_driver("550.163.01", "open"), manage="always")
    assert (taken["branch"], taken["module_type"], taken["adopted"]) == ("535", "auto", False)


def test_a_driver_waiting_for_a_reboot_is_adopted_as_the_packages_have_it():
    # 535 loaded, 550 (open) installed by packages: the node boots into 550.
    waiting = _driver("535.261.03", "proprietary", installed="550.163.01")
    waiting["installed_module_type"] = "open"
    chosen = _desired(waiting)
    assert (chosen["branch"], chosen["module_type"]) == ("550", "open")


def test_an_adopted_driver_these_settings_cannot_install_is_left_as_it_is():
    # NVIDIA's 550 on Debian 12, while driver_source says Debian's packages (535 only).
    node = {**facts("debian", "12"), "gpus": [T4], "driver": _driver("550.163.01", "open")}
    chosen = _desired(node["driver"])
    plan = driver_plan(node, chosen["branch"], CUDA, module_type="open", adopted=True)
    assert plan == {
        "as_is": "driver_branch: Debian 12 packages only the 535 branch, not 550; "
        "set driver_source: cuda-repo for other branches"
    }
    with pytest.raises(AnsibleFilterError, match="only the 535 branch"):
        driver_plan(node, "550", CUDA, module_type="open")  # named: refused


# -- the default branch: the newest the node's source offers that runs every GPU -------


@pytest.mark.parametrize(
    ("os_id", "source", "prefix"),
    [
        ("ubuntu", "distro", "nvidia-headless-"),
        ("ubuntu", "cuda-repo", "cuda-drivers-"),
        ("debian", "cuda-repo", "cuda-drivers-"),
        ("debian", "distro", ""),  # Debian's archive: one branch per release, known
        ("rocky", "cuda-repo", ""),  # dnf: not asked
    ],
)
def test_where_apt_is_asked_for_the_branches_a_source_offers(os_id, source, prefix):
    assert dp.offer_prefix(os_id, source) == prefix


def test_the_branches_offered_are_read_from_apts_package_names():
    canonical = [
        "nvidia-headless-535-server",
        "nvidia-headless-535-server-open",
        "nvidia-headless-570-server-open",
        "nvidia-headless-no-dkms-570-server",
        "nvidia-headless-470",
    ]
    assert dp.offered_branches("ubuntu", "distro", canonical) == ["535", "570"]
    cuda = ["cuda-drivers-535", "cuda-drivers-575", "cuda-drivers-fabricmanager-575"]
    assert dp.offered_branches("debian", "cuda-repo", cuda) == ["535", "575"]
    assert dp.offered_branches("debian", "distro", [], "12") == ["535"]
    assert dp.offered_branches("debian", "distro", [], "13") == ["550"]
    assert dp.offered_branches("debian", "distro", [], "14") == [], "a release not known"
    assert dp.offered_branches("ubuntu", "cuda-repo", []) == [], "repository not there yet"


def test_a_bare_node_gets_the_newest_offered_branch_that_runs_its_gpus():
    assert dp.default_branch([T4], ["470", "535", "570"]) == "570"
    assert dp.default_branch([T4, B200], ["535", "570"]) == "570"
    assert dp.default_branch([T4], []) == "535", "not known: 535"
    with pytest.raises(dp.PlanError) as refused:
        dp.default_branch([T4, B200], ["535"])
    assert str(refused.value) == (
        "driver_branch: the node's package source offers branch(es) 535, none of which runs "
        "every GPU of the node (GPU 0000:1b:00.0 (NVIDIA B200): Blackwell GPUs need branch "
        "570 or newer). Set driver_source to a source that has one, or name driver_branch."
    )


def test_an_adopted_driver_is_kept_where_the_defaults_could_install_none():
    # Blackwell on Debian's archive (535 only): the adopted 570 stays, and says why.
    chosen = _desired(_driver("570.172.08", "open"), gpus=[B200], offered=["535"])
    assert (chosen["branch"], chosen["module_type"], chosen["adopted"]) == ("570", "open", True)
    assert chosen["note"].startswith(
        "driver 570.172.08 (open) adopted as installed; the defaults would install none: "
        "driver_branch: the node's package source offers branch(es) 535"
    )


def test_a_named_branch_is_not_compared_with_the_defaults():
    # Branch named, flavour adopted as the defaults would choose it: nothing to say.
    chosen = _desired(_driver("550.163.01", "proprietary"), branch="550", offered=["535"])
    assert (chosen["adopted"], chosen["note"]) == (False, "")
    # Branch 570 named: auto would pick open there, so the proprietary kept is said.
    chosen = _desired(_driver("570.172.08", "proprietary"), branch="570")
    assert chosen["note"].endswith("the defaults would install branch 570 (open)")


def test_a_named_branch_with_an_adopted_flavour_is_checked_and_refused_as_named():
    """Only the flavour comes from the node: the branch the site named is checked
    against the GPUs and the source, never left as it is."""
    node = {**facts("debian", "12"), "gpus": [T4], "driver": _driver("535.261.03", "open")}
    chosen = _desired(node["driver"], branch="550")
    assert (chosen["module_type"], chosen["adopted"]) == ("open", False)
    with pytest.raises(AnsibleFilterError, match="only the 535 branch, not 550"):
        driver_plan(node, chosen["branch"], CUDA, module_type="open", adopted=chosen["adopted"])
    volta = _gpu((7, 0), name="Tesla V100", device="0x1db4")
    with pytest.raises(dp.PlanError, match="the 580 series is the last to run Volta GPUs"):
        dp.check_gpus("590", "proprietary", [volta])


def test_volta_caps_the_default_branch_at_580():
    volta = _gpu((7, 0), name="Tesla V100", device="0x1db4")
    assert dp.default_branch([volta, T4], ["535", "580", "590"]) == "580"
    with pytest.raises(dp.PlanError, match="and Volta or older ones 580 or older"):
        dp.default_branch([volta, B200], ["590"])


def test_always_keeps_the_default_steady_whatever_the_source_lists():
    # A first run before NVIDIA's repository is configured, and the next, agree.
    bare = _driver()
    assert _desired(bare, manage="always")["branch"] == "535"
    assert _desired(bare, manage="always", offered=["535", "580"])["branch"] == "535"
    assert _desired(bare, offered=["535", "580"])["branch"] == "580", "auto: adopted later"


def test_each_debian_release_defaults_to_its_own_archives_branch_under_auto_and_always():
    bare = {**facts("debian", "13"), "gpus": [T4], "driver": _driver()}
    for manage in ("auto", "always"):
        assert driver_desired(bare, manage=manage)["branch"] == "550", manage
        assert driver_desired({**bare, **facts("debian", "12")}, manage=manage)["branch"] == "535"
    # A Debian 13 node whose GPU needs a newer branch than its archive has is told so.
    b200 = {**bare, "gpus": [B200]}
    with pytest.raises(AnsibleFilterError, match="offers branch\\(es\\) 550, none of which"):
        driver_desired(b200)


def test_only_a_loaded_driver_is_left_as_it_is():
    node = {**facts("debian", "12"), "gpus": [T4], "driver": _driver(installed="550.163.01")}
    node["driver"]["installed_module_type"] = "open"
    chosen = _desired(node["driver"])
    assert chosen["adopted"] is True
    with pytest.raises(AnsibleFilterError, match="only the 535 branch, not 550"):
        driver_plan(node, chosen["branch"], CUDA, module_type="open", adopted=True)
