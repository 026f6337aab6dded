# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Kernel updates and the driver's module (docs/kernels.md).

On a converged simulated T4 (Debian 12, Debian's nvidia-kernel-dkms; a copy of the
session's onboarded node, conftest's bare_t4_snapshot), the site holds kernel updates
and names Debian's current kernel in driver_kernel_release: the reconciler rolls it in,
and Debian's DKMS builds the module for it against its headers, for real, signed with
the site's Machine Owner Key (the simulated node loads no module, but what a real host
would build, this one builds), before the node is rebooted. Back at guarded, a newer
kernel arrives by hand without headers, as unattended-upgrades would bring it: the
probe finds the kernel that would boot next without an nvidia module; with the repair
off, the driver stage stops naming it; with the repair on and its headers withheld,
the node is held on the kernel that has the module; and a reboot into a kernel without
the module is refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_runner_e2e import (
    FLEET,
    NO_CONTAINERS,
    PROJECT,
    SHORT_BACKOFF,
    Fleet,
    _copy_to_node,
    start_fleet,
)

pytestmark = pytest.mark.fleet

NODE = "kern-t4"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, bare_t4_snapshot: str) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("kernel")
    # A copy of the session's onboarded T4 (conftest), which runs no containers.
    inventory = start_fleet(work, {NODE: "t4-1"}, from_snapshot=bare_t4_snapshot)
    # The driver and its kernels are the subject: a node that serves no metrics either
    # has only the stages that matter here (its first cycle stops the exporter).
    (inventory / "bare.yml").write_text(NO_CONTAINERS + "    exporter_mode: none\n")
    try:
        fleet = Fleet(inventory, work / "state")
        first = fleet.runner("reconcile", "--once", *SHORT_BACKOFF)
        assert f"{NODE}: applied" in first.stdout, first.stdout + first.stderr
        exporter = fleet.on_node(NODE, "systemctl", "is-active", "nvidia-dcgm-exporter.service")
        assert exporter.stdout.strip() == "inactive", exporter.stdout
        stages = fleet.status()[NODE]["stages"]
        assert (stages["toolkit"], stages["exporter"]) == ("disabled", "disabled"), stages
        yield fleet
    finally:
        subprocess.run([*FLEET, "down", NODE], check=False)


def run_on_node(fleet: Fleet, *command: str) -> str:
    done = fleet.on_node(NODE, *command)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def no_initramfs(fleet: Fleet) -> None:
    """The node never boots the kernels these tests install, and nothing here reads an
    initramfs: initramfs-tools, which the kernel packages pull in, would build one per
    kernel twice (its kernel hook, then its trigger), about 17 s of CPU each. Its
    update-initramfs is diverted, as image builders do in a chroot, to a stub that does
    nothing (gpufleet's own rebuild, after a nouveau blacklist change, ran in the first
    apply, when the node had no initramfs-tools)."""
    run_on_node(
        fleet,
        "sh",
        "-c",
        "dpkg-divert --local --rename --add /usr/sbin/update-initramfs"
        " && printf '#!/bin/sh\\nexit 0\\n' > /usr/sbin/update-initramfs"
        " && chmod 755 /usr/sbin/update-initramfs",
    )


@pytest.fixture(scope="module")
def release(fleet: Fleet) -> str:
    """Debian's current kernel for bookworm: the release its metapackage depends on."""
    depends = run_on_node(fleet, "apt-cache", "depends", "linux-image-amd64")
    [image] = re.findall(r"Depends: linux-image-(\d\S+)", depends)
    return image


def install_newer_kernel(fleet: Fleet, release: str) -> str:
    """A newer kernel (Debian's 6.12, from backports) as unattended-upgrades would bring
    it: its metapackage, without headers, so DKMS's own kernel hook skips the module."""
    installed = fleet.on_node(
        NODE,
        *("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y"),
        *("--no-install-recommends", "linux-image-6.12-amd64"),
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # DKMS's own kernel hook, in its words: no headers, no module.
    assert "skipped since the kernel headers for this kernel do not seem to be installed" in (
        installed.stdout + installed.stderr
    )
    return newer_than(fleet, release)


def newer_than(fleet: Fleet, release: str) -> str:
    [newest] = [r for r in run_on_node(fleet, "linux-version", "list").split() if r != release]
    return newest


# The DKMS build below compiles NVIDIA's module for real (about 200 files; the longest
# step of the suite). ccache sits in front of the node's compiler for it, with its cache
# kept on the host between runs beside the other build caches, so a warm run compiles
# only what ccache cannot cache (most of it conftest.sh's probes): the build, its module and the
# signing are DKMS's as before. Debian's kernel headers call the compiler as gcc-12,
# which PATH finds first in /usr/local/bin. The build runs in apt's kernel header hook,
# and apt runs dpkg with a PATH of its own (DPkg::Path, /usr/sbin:/usr/bin:/sbin:/bin):
# on this node it is that PATH with /usr/local/bin first. The cache's place is in
# ccache's system configuration, as no environment of ours reaches that build.
# (where tests/sim's build scripts keep theirs: $GPUFLEET_BUILD_CACHE, else under
# $XDG_CACHE_HOME or ~/.cache)
BUILD_CACHE = os.environ.get("GPUFLEET_BUILD_CACHE") or (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpufleet"
)
COMPILER_CACHE = Path(BUILD_CACHE) / "e2e-dkms-ccache"
NODE_COMPILER_CACHE = "/var/cache/gpufleet-e2e-ccache"
APT_COMPILER_PATH = "/etc/apt/apt.conf.d/99e2e-ccache"


@pytest.fixture(scope="module")
def compiler_cache(fleet: Fleet) -> Iterator[None]:
    """ccache as the node's gcc-12, its cache brought from the host and taken back."""
    run_on_node(
        fleet,
        *("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y"),
        *("--no-install-recommends", "ccache"),
    )
    settings = f"cache_dir = {NODE_COMPILER_CACHE}\\nmax_size = 2G\\n"
    run_on_node(
        fleet,
        "sh",
        "-c",
        f"printf '{settings}' > /etc/ccache.conf && mkdir -p {NODE_COMPILER_CACHE}"
        " && ln -sf /usr/bin/ccache /usr/local/bin/gcc-12",
    )
    path = 'DPkg::Path "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";'
    run_on_node(fleet, "sh", "-c", f"echo '{path}' > {APT_COMPILER_PATH}")
    if COMPILER_CACHE.is_dir():
        _copy_to_node(NODE, COMPILER_CACHE, NODE_COMPILER_CACHE)
    run_on_node(fleet, "ccache", "--zero-stats")
    yield
    # Taken back whole or not at all: unpacked beside the old cache, then put in its place.
    fresh = COMPILER_CACHE.with_name(COMPILER_CACHE.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    with subprocess.Popen(
        ["podman", "exec", NODE, "tar", "-C", NODE_COMPILER_CACHE, "-cf", "-", "."],
        stdout=subprocess.PIPE,
    ) as packing:
        unpacked = subprocess.run(["tar", "-C", str(fresh), "-xf", "-"], stdin=packing.stdout)
    assert (packing.returncode, unpacked.returncode) == (0, 0), "the cache did not come back"
    print(run_on_node(fleet, "ccache", "--show-stats"))  # this run's hits (pytest -s)
    shutil.rmtree(COMPILER_CACHE, ignore_errors=True)
    fresh.rename(COMPILER_CACHE)


def modules_of(fleet: Fleet, release: str) -> list[str]:
    """The modules DKMS installed for `release` (the kernel's own tree has NVIDIA-named
    platform drivers, nvidia-wmi-ec-backlight, that are not the GPU driver)."""
    found = fleet.on_node(NODE, "find", f"/lib/modules/{release}/updates", "-name", "*.ko*")
    return sorted(Path(line).name for line in found.stdout.split())


def site_signing_key(fleet: Fleet, work: Path) -> str:
    """A Machine Owner Key of the site's, handed to the node's variables as a vault
    would (host_vars); returns its certificate's serial as openssl prints it."""
    key, certificate = work / "mok.key", work / "mok.pem"
    subprocess.run(
        [
            *("openssl", "req", "-new", "-x509", "-nodes", "-days", "30"),
            *("-subj", "/CN=gpufleet e2e module signing", "-newkey", "rsa:2048"),
            *("-keyout", str(key), "-out", str(certificate)),
        ],
        check=True,
        capture_output=True,
    )
    host_vars = fleet.inventory / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / f"{NODE}.yml").write_text(
        json.dumps(
            {
                "driver_secure_boot_signing_key": key.read_text(),
                "driver_secure_boot_signing_certificate": certificate.read_text(),
            }
        )
    )
    serial = subprocess.run(
        ["openssl", "x509", "-noout", "-serial", "-in", str(certificate)],
        check=True,
        capture_output=True,
        text=True,
    )
    return serial.stdout.strip().removeprefix("serial=")


# The site's kernel settings (an inventory file of their own, removed to go back).
KERNEL_SETTINGS = "kernel-updates.yml"
HOLDS_LIST = "/var/lib/gpufleet/kernel-holds"


def kernel_holds(fleet: Fleet) -> list[str]:
    """The kernel packages dpkg holds (apt-mark's list; the driver's are nvidia-*)."""
    return [name for name in run_on_node(fleet, "apt-mark", "showhold").split() if "linux" in name]


def site_held_package(release: str) -> str:
    """The headers every flavour of `release` shares (linux-headers-6.1.0-41-common)."""
    return "linux-headers-" + release.rsplit("-", 1)[0] + "-common"


def test_the_kernel_driver_kernel_release_names_is_rolled_in_with_its_module_and_held(
    fleet: Fleet, release: str, no_initramfs: None, compiler_cache: None, tmp_path: Path
):
    serial = site_signing_key(fleet, tmp_path)
    # A kernel package the site installed and held itself, before gpufleet held any.
    common = site_held_package(release)
    run_on_node(
        fleet,
        *("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y"),
        *("--no-install-recommends", common),
    )
    run_on_node(fleet, "apt-mark", "hold", common)
    settings = {"driver_kernel_updates": "held", "driver_kernel_release": release}
    (fleet.inventory / KERNEL_SETTINGS).write_text(json.dumps({"all": {"vars": settings}}))
    booted = fleet.booted(NODE)
    result = fleet.runner("reconcile", "--once", *SHORT_BACKOFF)
    # Rolled out: the cycle's plan (check mode) found the move disruptive, as the node
    # reboots into that kernel, so it went through the pool's rollout.
    line = next((row for row in result.stdout.splitlines() if row.startswith(f"  {NODE}: ")), "")
    assert line.startswith(f"  {NODE}: rolled-out; ") and "driver" in line, result.stdout
    assert fleet.booted(NODE) != booted, "the node was not rebooted into the kernel"
    # The kernel's headers came with the repair of a kernel without the module, and
    # Debian's DKMS built it against them (its dkms.conf renames the modules after
    # its package, nvidia-current*), signed with the site's key.
    driver = run_on_node(fleet, "dpkg-query", "-W", "-f=${Version}", "nvidia-kernel-dkms")
    version = driver.split("-")[0]
    assert modules_of(fleet, release) == [
        "nvidia-current-drm.ko",
        "nvidia-current-modeset.ko",
        "nvidia-current-peermem.ko",
        "nvidia-current-uvm.ko",
        "nvidia-current.ko",
    ]
    path = f"/lib/modules/{release}/updates/dkms/nvidia-current.ko"
    assert run_on_node(fleet, "modinfo", "-F", "version", path).strip() == version
    assert run_on_node(fleet, "modinfo", "-F", "vermagic", path).split()[0] == release
    dkms = run_on_node(fleet, "dkms", "status")
    assert f"nvidia-current/{version}, {release}, x86_64: installed" in dkms, dkms
    # Signed by DKMS with the site's key (kmod prints the serial's bytes).
    assert run_on_node(fleet, "modinfo", "-F", "signer", path).strip() == (
        "gpufleet e2e module signing"
    )
    sig_key = run_on_node(fleet, "modinfo", "-F", "sig_key", path).strip()
    assert sig_key.replace(":", "").lstrip("0") == serial.lstrip("0"), (sig_key, serial)
    key_mode = run_on_node(fleet, "stat", "-c", "%a %U", "/var/lib/gpufleet/module-signing/mok.key")
    assert key_mode.split() == ["600", "root"]
    # Held, and gpufleet's list names its holds.
    kernel = {f"linux-image-{release}", f"linux-headers-{release}"}
    assert kernel | {common} <= set(kernel_holds(fleet)), kernel_holds(fleet)
    listed = set(run_on_node(fleet, "cat", HOLDS_LIST).splitlines())
    assert kernel <= listed and common not in listed, listed  # the site's hold is its own
    # A hold released by hand is drift, and put back without a reboot.
    run_on_node(fleet, "apt-mark", "unhold", f"linux-image-{release}")
    booted = fleet.booted(NODE)
    again = fleet.runner("reconcile", "--once", *SHORT_BACKOFF)
    assert f"  {NODE}: applied; because drift" in again.stdout, again.stdout + again.stderr
    assert f"linux-image-{release}" in kernel_holds(fleet)
    assert fleet.booted(NODE) == booted
    steady = fleet.runner("plan")
    assert steady.returncode == 0, steady.stdout + steady.stderr  # nothing pending
    assert fleet.status()[NODE]["status"] == "converged"


def test_a_kernel_installed_by_hand_without_the_module_is_drift_and_stops_the_driver_stage(
    fleet: Fleet, release: str
):
    # A newer kernel arrives without its headers: installed by name, which holds on the
    # others do not stop (unattended-upgrades would bring it so with updates not held).
    newest = install_newer_kernel(fleet, release)
    record = run_on_node(fleet, "cat", "/var/lib/gpufleet/applied.json")
    off = json.dumps({"driver_kernel_repair": False})
    result = fleet.runner("reconcile", "--once", *SHORT_BACKOFF, "-e", off)
    words = f"kernel {newest} is installed and would boot next, but has no nvidia module"
    assert f"{NODE}: failed" in result.stdout, result.stdout + result.stderr
    assert words + ": driver_kernel_repair is false" in result.stdout, result.stdout
    drift = [e for e in fleet.history(NODE) if e["kind"] == "drift"]
    assert drift[-1]["component"] == "driver" and drift[-1]["summary"] == words, drift
    status = fleet.status()[NODE]
    assert status["status"] == "failed" and status["stages"]["driver"] == "failed", status
    # Nothing was built or changed: the last apply's record stands.
    assert modules_of(fleet, newest) == []
    assert run_on_node(fleet, "cat", "/var/lib/gpufleet/applied.json") == record


# Debian's /etc/default/grub, as grub-pc installs it (the settings that matter here).
DEFAULT_GRUB = """\
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="quiet"
GRUB_CMDLINE_LINUX=""
"""
HOLD_FILE = "/etc/default/grub.d/99-gpufleet-kernel.cfg"


def set_up_grub(fleet: Fleet) -> None:
    """GRUB as a host has it: Debian's packages and settings, its menu written by
    update-grub; only grub-probe stands in (a container's root has no disk)."""
    run_on_node(
        fleet,
        *("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y"),
        *("--no-install-recommends", "grub2-common", "grub-pc-bin"),
    )
    run_on_node(fleet, "dpkg-divert", "--local", "--rename", "--add", "/usr/sbin/grub-probe")
    probe = (PROJECT / "tests" / "sim" / "grub" / "grub-probe").read_text()
    script = "cat > /usr/sbin/grub-probe && chmod 755 /usr/sbin/grub-probe"
    done = subprocess.run(
        ["podman", "exec", "-i", NODE, "sh", "-c", script], input=probe, text=True, check=False
    )
    assert done.returncode == 0
    # What grub-install leaves on a host: the directory of GRUB's menu and environment.
    run_on_node(fleet, "mkdir", "-p", "/boot/grub")
    run_on_node(fleet, "sh", "-c", f"printf '%s' '{DEFAULT_GRUB}' > /etc/default/grub")
    run_on_node(fleet, "update-grub")


def grub_default(fleet: Fleet) -> str:
    menu = run_on_node(fleet, "cat", "/boot/grub/grub.cfg")
    [default] = re.findall(r'^\s*set default="(?!\$\{next_entry\})(.*)"$', menu, re.M)
    return default


def test_a_kernel_that_cannot_have_its_module_is_held_back_on_one_that_has_it(
    fleet: Fleet, release: str
):
    set_up_grub(fleet)
    # The newer kernel's headers are not in the archive (yet): the repair cannot build
    # its module. (A kernel's own hook skips update-grub in a container; on a host it
    # runs.)
    run_on_node(
        fleet,
        "sh",
        "-c",
        "printf 'Package: linux-headers-6.12*\\nPin: release *\\nPin-Priority: -1\\n'"
        " > /etc/apt/preferences.d/gpufleet-e2e-no-headers",
    )
    newest = newer_than(fleet, release)
    assert grub_default(fleet) == "0"  # GRUB boots the newest: without the module
    # The site lets kernel updates come again: gpufleet's holds go in the same cycle.
    (fleet.inventory / KERNEL_SETTINGS).unlink()
    time.sleep(2)  # past the backoff
    # The plan (check mode) predicts the hold and writes nothing.
    plan = fleet.runner("plan")
    assert plan.returncode == 5, plan.stdout + plan.stderr  # changes pending
    assert f"  {NODE}: planned; because " in plan.stdout, plan.stdout
    assert fleet.on_node(NODE, "test", "-e", HOLD_FILE).returncode == 1
    result = fleet.runner("reconcile", "--once", *SHORT_BACKOFF)
    assert f"  {NODE}: applied; because " in result.stdout, result.stdout + result.stderr
    drift = [e for e in fleet.history(NODE) if e["kind"] == "drift"]
    assert drift[-1]["summary"] == (
        f"kernel {newest} is installed and would boot next, but has no nvidia module"
    ), drift
    # GRUB now boots the kernel that has the module, and the site can read why.
    assert f"gnulinux-{release}-advanced-" in grub_default(fleet)
    hold = run_on_node(fleet, "cat", HOLD_FILE)
    assert f"# The node keeps booting {release}: kernel {newest} is installed" in hold
    assert modules_of(fleet, newest) == []
    # gpufleet's kernel holds are gone, the site's stays.
    assert kernel_holds(fleet) == [site_held_package(release)]
    assert fleet.on_node(NODE, "test", "-e", HOLDS_LIST).returncode == 1
    assert fleet.status()[NODE]["status"] == "converged"
    again = fleet.runner("reconcile", "--once", *SHORT_BACKOFF)
    assert "cycle: 1 probed, 0 planned, 0 applied" in again.stdout, again.stdout
    # The kernel held back goes (or gets its module): the hold is lifted.
    run_on_node(fleet, "apt-get", "purge", "-y", f"linux-image-{newest}", "linux-image-6.12-amd64")
    run_on_node(fleet, "update-grub")
    lifted = fleet.runner("reconcile", "--once", *SHORT_BACKOFF)
    assert f"  {NODE}: applied; because " in lifted.stdout, lifted.stdout + lifted.stderr
    drift = [e for e in fleet.history(NODE) if e["kind"] == "drift"]
    assert drift[-1]["summary"].endswith(
        f"the boot default gpufleet held on {release} can be lifted"
    ), drift
    assert grub_default(fleet) == "0"
    assert fleet.on_node(NODE, "test", "-e", HOLD_FILE).returncode == 1
    last = fleet.runner("reconcile", "--once", *SHORT_BACKOFF)
    assert "cycle: 1 probed, 0 planned, 0 applied" in last.stdout, last.stdout


REBOOT_PLAY = """\
- name: Reboot the node as the MIG stage does
  hosts: {node}
  gather_facts: false
  tasks:
    - name: Reboot under driver_reboot_policy
      ansible.builtin.include_role:
        name: driver
        tasks_from: reboot.yml
      vars:
        _driver_reboot_reason: for a MIG mode change
        _driver_converges_itself: false
"""


def test_a_reboot_into_a_kernel_without_the_module_is_refused(
    fleet: Fleet, release: str, tmp_path: Path
):
    version = run_on_node(fleet, "dkms", "status").split("/")[1].split(",")[0]
    run_on_node(fleet, "dkms", "uninstall", f"nvidia-current/{version}", "-k", release)
    assert modules_of(fleet, release) == []
    booted = fleet.booted(NODE)
    play = tmp_path / "reboot.yml"
    play.write_text(REBOOT_PLAY.format(node=NODE))
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(fleet.inventory),
            str(play),
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    said = " ".join(out.split())
    assert re.search(
        rf"not rebooting {NODE} for a MIG mode change: kernel {re.escape(release)} is "
        "installed and would boot next, but has no nvidia module, so the node would come "
        "back without its GPUs",
        said,
    ), said
    assert fleet.booted(NODE) == booted, "the node rebooted"
