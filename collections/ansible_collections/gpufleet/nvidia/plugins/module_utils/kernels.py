# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The kernels a node has, the one it boots next, and the NVIDIA module each one has.

A node loses its GPUs at a reboot when the kernel it boots has no NVIDIA module of its
driver: a kernel update arrived and DKMS did not build the module for it (no headers,
a failed build), or its precompiled module package does not exist yet. `read` gathers
what decides it; `problems` says, in words, what is wrong with the kernel that boots
next; `repair_packages` names what would give that kernel its module; `fallback` the
kernel to keep booting (a GRUB hold, grub.py, or grubby's on BLS entries, bls.py) when
it cannot have one.

Which kernel boots next, as the boot loaders decide it:
- Where GRUB's menu (grub.cfg) lists the kernels, as Debian's and Ubuntu's do: the
  entry its default names (grub.py), GRUB's environment block (`grubenv`) giving the
  one-time `next_entry` (grub-reboot) and the `saved_entry` (GRUB_DEFAULT=saved).
- Otherwise (RHEL's menus read boot loader entries at boot time) the environment
  block's `next_entry`, then its `saved_entry` where the default is the saved one
  (which RHEL's grubby sets); an entry names its kernel by release
  (`gnulinux-6.1.0-41-amd64-advanced-<uuid>`, `<machine-id>-5.14.0-427.el9.x86_64`).
  GRUB_DEFAULT (/etc/default/grub and grub.d) naming an entry by its title or id, the
  same way.
- Otherwise the newest kernel installed: Debian's and Ubuntu's GRUB scripts list the
  kernels newest first (version sort) and boot entry 0, and RHEL's kernel packages
  make the newest the default as they install.
A node with no kernel image under /boot (one that boots over the network, or a
container) boots something gpufleet cannot see: nothing is checked there.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.nvidia.plugins.module_utils import bls, grub, kernel_updates

BOOT_DIR = "/boot"
MODULES_DIR = "/lib/modules"
GRUBENV_PATHS = ("/boot/grub/grubenv", "/boot/grub2/grubenv")
# The site's module-signing certificate, where the driver stage writes it
# (driver_secure_boot_signing_certificate; roles/driver/vars/main.yml names the same
# path) and DKMS's configuration names it.
SITE_CERTIFICATE = "/var/lib/gpufleet/module-signing/mok.pem"
# Where DKMS packages put the module sources they register (<name>-<version>/dkms.conf).
DKMS_SOURCES = "/usr/src"
# The NVIDIA core module, as the packages install it under /lib/modules/<release>/:
# nvidia.ko from NVIDIA's DKMS packages (updates/dkms), Canonical's precompiled ones
# (kernel/nvidia-<branch>*) and NVIDIA's RHEL kmods (extra), nvidia-current.ko from
# Debian's DKMS package (its dkms.conf renames the modules after the package); plain
# or compressed as the kernel's modules are.
MODULE_FILE = re.compile(r"^nvidia(-current)?\.ko(\.(xz|zst|gz))?$")
# Not the kernel's tree: the headers DKMS builds against are linked from here.
_SKIPPED_DIRS = ("build", "source")
_VERSION_PART = re.compile(r"(\d+)|(\D+)")
_DKMS_FIELD = re.compile(r"""\s*(PACKAGE_NAME|PACKAGE_VERSION)=["']?([^"'\s]+)""")


def version_key(release):
    """Orders kernel releases as `sort -V` does: numbers as numbers (6.1.0-41 after
    6.1.0-9), other characters as text."""
    return [
        (0, int(number), "") if number else (1, 0, text)
        for number, text in _VERSION_PART.findall(release)
    ]


def installed(boot_dir=BOOT_DIR):
    """The releases of the kernel images under `boot_dir` (vmlinuz-<release>), oldest first."""
    try:
        names = os.listdir(boot_dir)
    except OSError:
        return []
    releases = [name[len("vmlinuz-") :] for name in names if name.startswith("vmlinuz-")]
    return sorted((r for r in releases if r), key=version_key)


def parse_grubenv(text):
    """GRUB's environment block: `name=value` lines, padded with '#'."""
    found = {}
    for line in (text or "").splitlines():
        name, sep, value = line.partition("=")
        if sep and not name.startswith("#"):
            found[name.strip()] = value.strip()
    return found


def _named(entry, releases):
    """The release an entry's title or id names (the longest that appears in it)."""
    named = [release for release in releases if release in (entry or "")]
    return max(named, key=len) if named else None


def boot_next(releases, grubenv, default, menu=None):
    """(release, how it was found) of the kernel the node boots next; (None, why) when
    no kernel image is installed. `grubenv` is parse_grubenv's, `default` GRUB_DEFAULT,
    `menu` grub.parse_cfg's of the menu GRUB runs: where that menu lists kernels, its
    default decides, as GRUB does."""
    if not releases:
        return None, "no kernel image under /boot"
    if menu and grub.releases(menu["entries"]):
        how, choice = "grub next_entry", grubenv.get("next_entry")
        if not choice:
            how, choice = "grub.cfg default", menu["default"]
        if choice in ("${saved_entry}", "saved"):
            how, choice = "grub saved_entry", grubenv.get("saved_entry")
        release = grub.resolve(menu["entries"], choice)
        if release in releases:
            return release, how
    choices = [("grub next_entry", grubenv.get("next_entry"))]
    if default == "saved":
        choices.append(("grub saved_entry", grubenv.get("saved_entry")))
    elif default and not default.isdigit():
        choices.append(("GRUB_DEFAULT", default))
    for how, entry in choices:
        release = _named(entry, releases)
        if release:
            return release, how
    return releases[-1], "newest installed"


def find_module(release, modules_dir=MODULES_DIR):
    """The path of the nvidia module installed for `release`, or None."""
    top = os.path.join(modules_dir, release)
    for root, dirs, files in os.walk(top):
        if root == top:
            dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS]
        for name in sorted(files):
            if MODULE_FILE.match(name):
                return os.path.join(root, name)
    return None


def parse_modinfo(text):
    """The `version`, the kernel release of `vermagic` (`built_for`), and the signature's
    `signer` and `sig_key` (the signing certificate's serial, as kmod prints it: hex
    bytes joined by colons) in modinfo's output; None for a field it lacks."""
    fields = {}
    for line in (text or "").splitlines():
        name, sep, value = line.partition(":")
        name = name.strip()
        if sep and name in ("version", "vermagic", "signer", "sig_key") and name not in fields:
            fields[name] = value.strip()
    vermagic = fields.get("vermagic", "")
    return {
        "version": fields.get("version") or None,
        "built_for": vermagic.split()[0] if vermagic else None,
        "signer": fields.get("signer") or None,
        "sig_key": fields.get("sig_key") or None,
    }


def key_id(serial):
    """A certificate serial as one form, whether kmod printed it (2E:88:…) or openssl
    (serial=2E88…): upper-case hex, no separators, no leading zero bytes."""
    text = (serial or "").split("=")[-1].replace(":", "").strip().upper()
    while text.startswith("00") and len(text) > 2:
        text = text[2:]
    return text or None


def certificate_serial(run, openssl, path):
    """(serial, None) of the certificate (PEM or DER) at `path` as key_id gives it, read
    with openssl x509; (None, why) when it cannot be read."""
    if not openssl:
        return None, "openssl is not installed"
    form = "DER" if (_read_bytes(path, 1) or b"") == b"\x30" else "PEM"  # a DER SEQUENCE
    rc, out, err = run([openssl, "x509", "-inform", form, "-noout", "-serial", "-in", path])
    serial = key_id(out) if rc == 0 else None
    return (serial, None) if serial else (None, (err or out).strip() or "no serial")


def dkms_sources(src_dir=DKMS_SOURCES):
    """The NVIDIA module sources DKMS can build, [{name, version}] from each
    <src_dir>/*/dkms.conf whose PACKAGE_NAME starts with "nvidia" (nvidia-current on
    Debian, nvidia on NVIDIA's repository, nvidia-srv and the like on Ubuntu)."""
    try:
        names = sorted(os.listdir(src_dir))
    except OSError:
        return []
    found = []
    for name in names:
        fields = {}
        for line in (_read(os.path.join(src_dir, name, "dkms.conf")) or "").splitlines():
            match = _DKMS_FIELD.match(line)
            if match:
                fields.setdefault(match.group(1), match.group(2))
        package = fields.get("PACKAGE_NAME", "")
        if package.startswith("nvidia") and fields.get("PACKAGE_VERSION"):
            found.append({"name": package, "version": fields["PACKAGE_VERSION"]})
    return found


def read(run, which, paths=None):
    """The node's kernels: {running, installed, boot_next, boot_next_from, modules, dkms,
    grub, held_packages}, where modules maps each installed release (and the running
    one) to its nvidia module ({path, version, built_for, signer, sig_key}) or None,
    dkms lists the module sources DKMS could build (dkms_sources), grub is grub_facts'
    (bls_facts' on a node that boots BLS entries, as RHEL's do) and held_packages names
    the kernel packages gpufleet holds (kernel_updates.HOLDS_FILE; None without that
    file). `run(argv)` gives (rc, out, err); `which` a program's path. `paths`
    overrides BOOT_DIR, MODULES_DIR, GRUBENV_PATHS, DKMS_SOURCES, GRUB_CFG_PATHS,
    GRUB_SETTINGS, GRUB_SETTINGS_DIR, GRUB_HOLD_FILE, BLS_ENTRIES_DIR, BLS_HOLD_FILE,
    SYSCONFIG_KERNEL and KERNEL_HOLDS_FILE (by those names, for tests)."""
    where = {
        "BOOT_DIR": BOOT_DIR,
        "MODULES_DIR": MODULES_DIR,
        "GRUBENV_PATHS": GRUBENV_PATHS,
        "DKMS_SOURCES": DKMS_SOURCES,
        "GRUB_CFG_PATHS": grub.CONFIG_PATHS,
        "GRUB_SETTINGS": grub.SETTINGS,
        "GRUB_SETTINGS_DIR": grub.SETTINGS_DIR,
        "GRUB_HOLD_FILE": grub.HOLD_FILE,
        "BLS_ENTRIES_DIR": bls.ENTRIES_DIR,
        "BLS_HOLD_FILE": bls.HOLD_FILE,
        "SYSCONFIG_KERNEL": bls.SYSCONFIG_KERNEL,
        "KERNEL_HOLDS_FILE": kernel_updates.HOLDS_FILE,
        **(paths or {}),
    }
    releases = installed(where["BOOT_DIR"])
    grubenv = parse_grubenv(_first(where["GRUBENV_PATHS"])[1])
    config, menu = _first(where["GRUB_CFG_PATHS"])
    menu = grub.parse_cfg(menu)
    settings = _settings(where)
    default = grub.setting(settings.values())
    following, how = boot_next(releases, grubenv, default, menu)
    # A menu that lists no kernel: RHEL's, which boots BLS entries.
    listed = grub.releases(menu["entries"])
    entries = None if listed else bls_facts(where, releases, default)
    running = os.uname().release
    modinfo = which("modinfo")
    modules = {}
    for release in sorted({*releases, running}, key=version_key):
        modules[release] = _module(run, modinfo, find_module(release, where["MODULES_DIR"]))
    return {
        "running": running,
        "installed": releases,
        "boot_next": following,
        "boot_next_from": how,
        "modules": modules,
        "dkms": dkms_sources(where["DKMS_SOURCES"]),
        "grub": entries
        or grub_facts(config, menu, settings, where["GRUB_HOLD_FILE"], releases, grubenv),
        "held_packages": kernel_updates.owned(_read(where["KERNEL_HOLDS_FILE"])),
    }


def bls_facts(where, releases, default):
    """Where the node boots boot loader entries (RHEL): grub_facts' keys for them
    (entries: each release's entry id, as saved_entry names it), method "grubby", and
    bls.facts'; None on a node without entries."""
    ids = bls.entries(where["BLS_ENTRIES_DIR"], _read)
    if not ids:
        return None
    found = bls.facts(
        releases,
        ids,
        _read(where["BLS_HOLD_FILE"]),
        _read(where["SYSCONFIG_KERNEL"]),
        default,
    )
    return {
        **found,
        "method": "grubby",
        "config": None,
        "hold_file": where["BLS_HOLD_FILE"],
        "sysconfig": where["SYSCONFIG_KERNEL"],
        "read_after": {},
    }


def grub_facts(config, menu, settings, hold_file, releases, grubenv):
    """{method: "grub-mkconfig" (None without a menu that lists kernels), config: the
    menu's path (None without one that lists kernels), hold_file, held:
    the release gpufleet's hold file keeps booting (None without a hold), unheld: the
    release the node would boot next without the hold, entries: each release's entry
    as GRUB_DEFAULT names it, read_after: {path: GRUB_DEFAULT} of the settings files read
    after the hold file that set the default}. `settings` maps the GRUB settings files
    to their text."""
    listed = grub.releases(menu["entries"])
    held = None
    if hold_file in settings:
        value = grub.setting([settings[hold_file]])
        held = grub.resolve(menu["entries"], value) if value and listed else None
    site = grub.setting(text for path, text in settings.items() if path != hold_file)
    unheld = boot_next(releases, grubenv, site, {**menu, "default": site})[0] if held else None
    return {
        "method": "grub-mkconfig" if listed else None,
        "config": config if listed else None,
        "hold_file": hold_file,
        "held": held,
        "unheld": unheld,
        "entries": {r: grub.entry_path(menu["entries"], r) for r in dict.fromkeys(listed)},
        "read_after": grub.read_after(settings, hold_file),
    }


def _settings(where):
    """GRUB's settings files as grub-mkconfig reads them, in order, to their text."""
    paths = [where["GRUB_SETTINGS"]]
    try:
        names = sorted(os.listdir(where["GRUB_SETTINGS_DIR"]))
    except OSError:
        names = []
    paths += [os.path.join(where["GRUB_SETTINGS_DIR"], n) for n in names if n.endswith(".cfg")]
    texts = {path: _read(path) for path in paths}
    return {path: text for path, text in texts.items() if text is not None}


def _first(paths):
    """(path, text) of the first of `paths` that can be read; (None, None) without one."""
    for path in paths:
        text = _read(path)
        if text is not None:
            return path, text
    return None, None


def _module(run, modinfo, path):
    if not path:
        return None
    module = {"path": path, "version": None, "built_for": None, "signer": None, "sig_key": None}
    if modinfo:
        rc, out, _err = run([modinfo, path])
        if rc == 0:
            module.update(parse_modinfo(out))
    return module


def problems(kernel, driver_version, signing_key=None, release=None):
    """What is wrong with the kernel `kernel` (read's facts) boots next (or with kernel
    `release`, were it to boot next), for a node whose driver is `driver_version`: []
    when it has that driver's module, when nothing can be seen to boot, or when the node
    has no driver. With `signing_key` (the serial of the site's module-signing
    certificate, see key_id), a module not signed with it is wrong too: Secure Boot
    would refuse to load it."""
    release = release or kernel.get("boot_next")
    if not release or not driver_version:
        return []
    module = kernel["modules"].get(release)
    if module is None:
        return [f"kernel {release} is installed and would boot next, but has no nvidia module"]
    found = []
    if module["version"] and module["version"] != driver_version:
        found.append(
            f"kernel {release} would boot next with nvidia module {module['version']}, "
            f"not the driver's {driver_version} (its GPUs would fail with a "
            "driver/library version mismatch)"
        )
    if module["built_for"] and module["built_for"] != release:
        found.append(
            f"kernel {release} would boot next, but its nvidia module "
            f"({module['path']}) was built for kernel {module['built_for']}"
        )
    wanted = key_id(signing_key)
    if wanted and key_id(module.get("sig_key")) != wanted:
        signed = (
            f"signed with key {module['sig_key']} ({module.get('signer') or 'no signer named'})"
            if module.get("sig_key")
            else "not signed"
        )
        found.append(
            f"kernel {release} would boot next, but its nvidia module is {signed}, "
            f"not with the site's key {wanted} (Secure Boot would refuse to load it)"
        )
    return found


def fallback(kernel, driver_version, signing_key=None):
    """The kernel to keep booting while the one that would boot next lacks the driver's
    module: the running kernel where it has the module and a GRUB entry, else the newest
    installed that has both; None without one (no GRUB menu listing kernels, say)."""
    entries = (kernel.get("grub") or {}).get("entries") or {}
    candidates = [kernel["running"], *reversed(kernel["installed"])]
    for release in candidates:
        if entries.get(release) and not problems(kernel, driver_version, signing_key, release):
            return release
    return None


def repair_packages(plan, release, available=()):
    """The packages that give kernel `release` its nvidia module under the driver plan
    `plan` (driver_plan's), with `available` the names apt knows under the plan's
    precompiled prefix: Canonical's precompiled, signed module package where one exists
    for that kernel; otherwise the kernel's headers, against which the driver's DKMS
    package builds the module (DKMS's kernel hooks build it as the headers arrive),
    with that DKMS package where the node had precompiled modules until now."""
    precompiled = plan.get("precompiled")
    if precompiled and precompiled["prefix"] + release in set(available):
        return {"how": "precompiled", "packages": [precompiled["prefix"] + release]}
    headers = f"kernel-devel-{release}" if plan["family"] == "rhel" else f"linux-headers-{release}"
    dkms = [precompiled["dkms_package"]] if precompiled else []
    return {"how": "dkms", "packages": [*dkms, headers]}


def _read_bytes(path, size):
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError:
        return None


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None
