# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The kernel a node boots next and its NVIDIA module: reading /boot, GRUB's choice,
the modules under /lib/modules, the problems in words, and what repairs them per
package source."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_plan as dp
from ansible_collections.gpufleet.nvidia.plugins.module_utils import grub, kernels
from ansible_collections.gpufleet.nvidia.plugins.module_utils import node_state as ns
from conftest import make_certificate
from runner.words import drift_summary

OLD, NEW = "6.1.0-9-amd64", "6.1.0-41-amd64"
# What kmod's modinfo prints for a module built by Debian's DKMS package (fields cut).
MODINFO = """\
filename:       /lib/modules/6.1.0-41-amd64/updates/dkms/nvidia-current.ko
alias:          char-major-195-*
version:        535.261.03
supported:      external
license:        NVIDIA
firmware:       nvidia/535.261.03/gsp_tu10x.bin
srcversion:     6E0C3A1B1E0AC1D1E8D2E4A
alias:          pci:v000010DEd*sv*sd*bc06sc80i00*
depends:        drm
retpoline:      Y
name:           nvidia
vermagic:       6.1.0-41-amd64 SMP preempt mod_unload modversions \n"""


def test_releases_sort_as_version_numbers_not_text() -> None:
    releases = ["6.1.0-41-amd64", "6.1.0-9-amd64", "6.12.57+deb13-amd64", "5.10.0-35-amd64"]
    assert sorted(releases, key=kernels.version_key) == [
        "5.10.0-35-amd64",
        "6.1.0-9-amd64",
        "6.1.0-41-amd64",
        "6.12.57+deb13-amd64",
    ]


def _boot(tmp_path: Path, *releases: str) -> Path:
    boot = tmp_path / "boot"
    boot.mkdir(parents=True, exist_ok=True)
    for release in releases:
        (boot / f"vmlinuz-{release}").write_bytes(b"")
        (boot / f"initrd.img-{release}").write_bytes(b"")
    (boot / "config-ignored").write_text("")
    return boot


def test_installed_kernels_are_the_images_under_boot(tmp_path: Path) -> None:
    assert kernels.installed(_boot(tmp_path, NEW, OLD)) == [OLD, NEW]
    assert kernels.installed(tmp_path / "none") == []


@pytest.mark.parametrize(
    ("grubenv", "default", "expected"),
    [
        # Debian and Ubuntu: GRUB_DEFAULT=0, entries newest first.
        ("", "0", (NEW, "newest installed")),
        ("", None, (NEW, "newest installed")),
        # grub-reboot's one-time choice wins over everything.
        (
            f"next_entry=gnulinux-advanced-1f2e>gnulinux-{OLD}-advanced-1f2e\n",
            "0",
            (OLD, "grub next_entry"),
        ),
        # RHEL: GRUB_DEFAULT=saved, a BLS entry id (machine id, release).
        (f"saved_entry=0f1e2d3c4b5a-{OLD}\n", "saved", (OLD, "grub saved_entry")),
        # saved_entry counts only where the default is the saved one.
        (f"saved_entry=0f1e2d3c4b5a-{OLD}\n", "0", (NEW, "newest installed")),
        # GRUB_DEFAULT naming an entry by its title.
        (
            "",
            f"Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {OLD}",
            (OLD, "GRUB_DEFAULT"),
        ),
        # An entry that names no installed kernel: GRUB falls back to the first one.
        ("saved_entry=gnulinux-5.10.0-35-amd64-advanced\n", "saved", (NEW, "newest installed")),
    ],
)
def test_the_kernel_that_boots_next_is_the_boot_loaders_choice(
    grubenv: str, default: str | None, expected: tuple[str, str]
) -> None:
    padded = "# GRUB Environment Block\n" + grubenv + "#" * 64
    assert kernels.boot_next([OLD, NEW], kernels.parse_grubenv(padded), default) == expected


def test_grub_default_is_read_from_its_last_setting() -> None:
    site = 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n# GRUB_DEFAULT=2\nGRUB_DEFAULT="saved"\n'
    assert grub.setting([site]) == "saved"
    assert grub.setting([site, "GRUB_DEFAULT='1>2'\n"]) == "1>2"  # grub.d after it
    assert grub.setting([None]) is None


def test_no_kernel_image_means_nothing_to_check() -> None:
    assert kernels.boot_next([], {}, "0") == (None, "no kernel image under /boot")


def _module(modules: Path, release: str, where: str, name: str) -> Path:
    path = modules / release / where / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


@pytest.mark.parametrize(
    ("where", "name"),
    [
        ("updates/dkms", "nvidia-current.ko"),  # Debian's DKMS package
        ("updates/dkms", "nvidia.ko.zst"),  # NVIDIA's DKMS packages, compressed
        ("kernel/nvidia-535srv", "nvidia.ko"),  # Canonical's precompiled modules
        ("extra", "nvidia.ko.xz"),  # NVIDIA's RHEL kmod
    ],
)
def test_the_core_module_is_found_where_each_source_installs_it(
    tmp_path: Path, where: str, name: str
) -> None:
    modules = tmp_path / "modules"
    _module(modules, NEW, where, "nvidia-current-uvm.ko")
    path = _module(modules, NEW, where, name)
    assert kernels.find_module(NEW, modules) == str(path)
    assert kernels.find_module(OLD, modules) is None


def test_a_module_only_in_the_headers_tree_does_not_count(tmp_path: Path) -> None:
    modules = tmp_path / "modules"
    (modules / NEW).mkdir(parents=True)
    build = tmp_path / "headers"
    _module(build, "", "drivers", "nvidia.ko")
    (modules / NEW / "build").symlink_to(build)
    (modules / NEW / "source").mkdir()
    _module(modules, NEW, "source", "nvidia.ko")
    assert kernels.find_module(NEW, modules) is None


def test_modinfo_gives_the_version_and_the_kernel_it_was_built_for() -> None:
    assert kernels.parse_modinfo(MODINFO) == {
        "version": "535.261.03",
        "built_for": NEW,
        "signer": None,
        "sig_key": None,
    }
    assert set(kernels.parse_modinfo("").values()) == {None}


def _read(tmp_path: Path, running: str, modinfo: dict[str, str]) -> dict:
    boot = _boot(tmp_path, OLD, NEW)
    modules = tmp_path / "modules"
    for release in modinfo:
        _module(modules, release, "updates/dkms", "nvidia-current.ko")

    def run(argv: list[str]) -> tuple[int, str, str]:
        release = Path(argv[1]).parts[-4]
        return 0, modinfo[release], ""

    paths = {
        "BOOT_DIR": str(boot),
        "MODULES_DIR": str(modules),
        "GRUBENV_PATHS": (str(boot / "grub" / "grubenv"),),
        "GRUB_CFG_PATHS": (str(boot / "grub" / "grub.cfg"),),
        "GRUB_SETTINGS": str(tmp_path / "default-grub"),
        "GRUB_SETTINGS_DIR": str(tmp_path / "default-grub.d"),
        "BLS_ENTRIES_DIR": str(tmp_path / "no-bls-entries"),
        "KERNEL_HOLDS_FILE": str(tmp_path / "kernel-holds"),
    }
    facts = kernels.read(run, lambda name: f"/usr/sbin/{name}", paths)
    facts["running"] = running  # the test machine's own kernel otherwise
    return facts


def test_a_kernel_update_without_its_module_is_named(tmp_path: Path) -> None:
    facts = _read(tmp_path, OLD, {OLD: MODINFO.replace(NEW, OLD)})
    assert facts["installed"] == [OLD, NEW]
    assert (facts["boot_next"], facts["boot_next_from"]) == (NEW, "newest installed")
    assert facts["modules"][NEW] is None
    assert facts["modules"][OLD]["version"] == "535.261.03"
    assert kernels.problems(facts, "535.261.03") == [
        f"kernel {NEW} is installed and would boot next, but has no nvidia module"
    ]


def test_a_module_of_another_driver_or_kernel_is_named(tmp_path: Path) -> None:
    stale = MODINFO.replace("535.261.03", "535.247.01").replace(
        f"vermagic:       {NEW}", f"vermagic:       {OLD}"
    )
    facts = _read(tmp_path, OLD, {NEW: stale})
    found = kernels.problems(facts, "535.261.03")
    assert found == [
        f"kernel {NEW} would boot next with nvidia module 535.247.01, not the driver's "
        "535.261.03 (its GPUs would fail with a driver/library version mismatch)",
        f"kernel {NEW} would boot next, but its nvidia module "
        f"({facts['modules'][NEW]['path']}) was built for kernel {OLD}",
    ]


def test_nothing_is_wrong_with_the_module_in_place_or_without_a_driver(tmp_path: Path) -> None:
    facts = _read(tmp_path, OLD, {OLD: MODINFO.replace(NEW, OLD), NEW: MODINFO})
    assert kernels.problems(facts, "535.261.03") == []
    assert kernels.problems({**facts, "modules": {}}, None) == []


def test_kernel_drift_holds_the_recorded_driver_and_says_why_in_one_line(tmp_path: Path) -> None:
    facts = _read(tmp_path, OLD, {OLD: MODINFO.replace(NEW, OLD)})
    record = {
        "components": {"driver": {"packages": {"nvidia-kernel-dkms": {"version": "535.261.03-1"}}}},
        "node": {"driver": {"version": "535.261.03", "module_type": "proprietary"}},
    }
    [entry] = ns.kernel_drift(facts, record)
    assert entry["kind"] == "kernel" and entry["name"] == NEW
    assert (entry["recorded"], entry["current"]) == ({"nvidia": "535.261.03"}, {"nvidia": None})
    assert drift_summary(entry) == (
        f"kernel {NEW} is installed and would boot next, but has no nvidia module"
    )
    # A node the last apply left without a driver (no GPU) has no kernel drift; nor has
    # one whose driver gpufleet leaves alone (pre-installed: the stage records nothing),
    # which no apply would repair.
    assert ns.kernel_drift(facts, {**record, "node": {"driver": {"version": None}}}) == []
    unmanaged = {"components": {"driver": {"files": {}, "packages": {}}}, "node": record["node"]}
    assert ns.kernel_drift(facts, unmanaged) == []


def test_kernel_drift_names_a_module_not_signed_with_the_sites_key(tmp_path: Path) -> None:
    """The probe checks what the driver stage and every reboot check: with the site's
    certificate on the node, the module of the kernel that boots next must carry its
    serial."""
    signed = MODINFO + "signer:         someone else\nsig_key:        0A:1B:2C\n"
    facts = _read(tmp_path, OLD, {OLD: MODINFO.replace(NEW, OLD), NEW: signed})
    record = {
        "components": {"driver": {"packages": {"nvidia-kernel-dkms": {"version": "535.261.03-1"}}}},
        "node": {"driver": {"version": "535.261.03", "module_type": "proprietary"}},
    }
    assert ns.kernel_drift(facts, record) == []
    [entry] = ns.kernel_drift(facts, record, "0A1B2D")
    assert drift_summary(entry) == (
        f"kernel {NEW} would boot next, but its nvidia module is signed with key 0A:1B:2C "
        "(someone else), not with the site's key 0A1B2D (Secure Boot would refuse to load it)"
    )
    assert ns.kernel_drift(facts, record, "0A1B2C") == []


def test_a_certificates_serial_is_read_with_openssl(tmp_path: Path) -> None:
    certificate = make_certificate(tmp_path, "site")
    said = subprocess.run(
        ["openssl", "x509", "-noout", "-serial", "-in", str(certificate)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout

    def run(argv: list[str]) -> tuple[int, str, str]:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr

    serial = kernels.certificate_serial(run, "openssl", str(certificate))
    assert serial == (kernels.key_id(said), None)
    der = tmp_path / "site.der"
    subprocess.run(
        ["openssl", "x509", "-outform", "DER", "-in", str(certificate), "-out", str(der)],
        check=True,
    )
    assert kernels.certificate_serial(run, "openssl", str(der)) == serial
    missing, why = kernels.certificate_serial(run, "openssl", str(tmp_path / "none.pem"))
    assert missing is None and why
    assert kernels.certificate_serial(run, None, str(der)) == (None, "openssl is not installed")


def _plan(os_id: str, version: str, source: str, module_type: str = "proprietary") -> dict:
    return dp.plan(
        os_id,
        version,
        OLD,
        "535",
        "",
        module_type,
        source,
        "https://developer.download.nvidia.com/compute/cuda/repos",
    )


def test_debian_gets_the_kernels_headers_for_its_dkms_package() -> None:
    plan = _plan("debian", "12", "distro")
    assert kernels.repair_packages(plan, NEW) == {
        "how": "dkms",
        "packages": [f"linux-headers-{NEW}"],
    }


def test_ubuntu_gets_canonicals_signed_module_package_where_the_archive_has_one() -> None:
    plan = _plan("ubuntu", "24.04", "distro", "open")
    release = "6.8.0-51-generic"
    package = f"linux-modules-nvidia-535-server-open-{release}"
    assert kernels.repair_packages(plan, release, [package]) == {
        "how": "precompiled",
        "packages": [package],
    }
    # A kernel Canonical built no modules for (a mainline or HWE kernel too new):
    # DKMS, with Canonical's DKMS package, builds it against its headers.
    assert kernels.repair_packages(plan, release, []) == {
        "how": "dkms",
        "packages": ["nvidia-dkms-535-server-open", f"linux-headers-{release}"],
    }


def test_nvidias_repository_and_rhel_get_headers_for_their_dkms_packages() -> None:
    assert kernels.repair_packages(_plan("ubuntu", "22.04", "cuda-repo"), NEW)["packages"] == [
        f"linux-headers-{NEW}"
    ]
    release = "5.14.0-503.14.1.el9_5.x86_64"
    assert kernels.repair_packages(_plan("rocky", "9.5", "cuda-repo"), release) == {
        "how": "dkms",
        "packages": [f"kernel-devel-{release}"],
    }


SIGNED = MODINFO + (
    "signer:         gpufleet site module signing\n"
    "sig_key:        00:9C:1D:2E:88:CD:FA:CF:D1:CF:9A:8C:AB:D3:EF:E9:BE:35:23:73\n"
    "sig_hashalgo:   sha256\n"
)


def test_modinfo_gives_the_signer_and_the_key_id_and_both_spellings_of_a_serial_agree() -> None:
    fields = kernels.parse_modinfo(SIGNED)
    assert fields["signer"] == "gpufleet site module signing"
    # openssl's spelling of the same serial (x509 -serial), without the leading zero byte.
    assert kernels.key_id(fields["sig_key"]) == kernels.key_id(
        "serial=9C1D2E88CDFACFD1CF9A8CABD3EFE9BE352373"
    )
    assert kernels.parse_modinfo(MODINFO)["sig_key"] is None


def test_with_the_sites_key_a_module_signed_otherwise_or_not_at_all_is_named(
    tmp_path: Path,
) -> None:
    site = "serial=9C1D2E88CDFACFD1CF9A8CABD3EFE9BE352373"
    facts = _read(tmp_path, OLD, {NEW: SIGNED})
    assert kernels.problems(facts, "535.261.03", site) == []
    other = SIGNED.replace("00:9C:1D", "00:7A:1D").replace("gpufleet site", "DKMS")
    facts = _read(tmp_path / "other", OLD, {NEW: other})
    assert kernels.problems(facts, "535.261.03", site) == [
        f"kernel {NEW} would boot next, but its nvidia module is signed with key "
        "00:7A:1D:2E:88:CD:FA:CF:D1:CF:9A:8C:AB:D3:EF:E9:BE:35:23:73 (DKMS module signing), "
        "not with the site's key 9C1D2E88CDFACFD1CF9A8CABD3EFE9BE352373 (Secure Boot would "
        "refuse to load it)"
    ]
    facts = _read(tmp_path / "unsigned", OLD, {NEW: MODINFO})
    assert kernels.problems(facts, "535.261.03", site)[0].endswith(
        "its nvidia module is not signed, not with the site's key "
        "9C1D2E88CDFACFD1CF9A8CABD3EFE9BE352373 (Secure Boot would refuse to load it)"
    )
    # Without a site key, DKMS's own signature (or none) is not judged.
    assert kernels.problems(facts, "535.261.03") == []
