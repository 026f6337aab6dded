#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible module: the kernel a node boots next, and whether it has the driver's module."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: boot_kernel
short_description: Find the kernel a node boots next and whether it has the NVIDIA module
version_added: 0.2.0
description:
  - Reads the kernel images under C(/boot), the one the boot loader starts next (GRUB's
    C(next_entry), its C(saved_entry) where C(GRUB_DEFAULT=saved), C(GRUB_DEFAULT)
    naming an entry, else the newest installed, as Debian's, Ubuntu's and RHEL's boot
    set-ups choose) and, for each of them and the running kernel, the nvidia module
    installed under C(/lib/modules/<release>) with its version and the kernel its
    C(vermagic) names (C(modinfo)).
  - Says what is wrong with the kernel that boots next for the node's driver - no nvidia
    module, a module of another version, a module built for another kernel - so that
    a role can give it the module, or refuse a reboot that would leave the node
    without its GPUs.
  - A node with no kernel image under C(/boot) (one booted over the network, a
    container) boots a kernel this module cannot see; nothing is reported wrong there.
  - Where that kernel lacks the module, names the kernel to keep booting instead (the
    running one, else the newest installed with the module and a GRUB entry) and the
    GRUB settings file that would make it the default; where gpufleet already holds
    the node on a kernel, says whether the one held back has its module now.
  - Reads only; changes nothing.
options:
  driver_version:
    description:
      - The driver version the kernel's module must have. Empty means the version a
        package manager installed (C(dpkg-query) or C(rpm)), else the version
        C(modinfo) reports for the running kernel's module.
    type: str
    default: ""
  signing_certificate:
    description:
      - The certificate (PEM or DER) of the key the site signs modules with, on the
        node. When set, a module of the kernel that boots next that is not signed with
        it (C(modinfo)'s C(sig_key) against the certificate's serial, read with
        C(openssl x509)) is a problem too - under Secure Boot the kernel would refuse to
        load it.
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the kernel the node boots next
  gpufleet.nvidia.boot_kernel:
  register: _boot

- name: Refuse to reboot into a kernel without the driver's module
  ansible.builtin.fail:
    msg: "{{ _boot.problems | join('; ') }}"
  when: _boot.problems | length > 0
"""

RETURN = r"""
kernel:
  description:
    - C(running), C(installed) (releases with an image under C(/boot), oldest first),
      C(boot_next) (null without one), C(boot_next_from) (C(grub next_entry),
      C(grub.cfg default), C(grub saved_entry), C(GRUB_DEFAULT) or C(newest installed))
      and C(modules), each of those releases to its nvidia module (C(path),
      C(version), C(built_for)) or null; C(grub), how a hold is made (C(method),
      C(grub-mkconfig), C(grubby) where the node boots BLS entries, as RHEL's do, or
      null), GRUB's menu (C(config)), gpufleet's hold file (C(hold_file)), the release it
      keeps booting (C(held)) and the one the node would boot without it (C(unheld)),
      each release's entry (C(entries)), and the settings files read after the hold
      file that set GRUB_DEFAULT, to the value they set (C(read_after)); with
      C(grubby), also the kernel held back (C(held_back)), C(/etc/sysconfig/kernel)
      (C(sysconfig)) and its UPDATEDEFAULT now (C(updatedefault)) and the site's own
      (C(site_updatedefault)), and whether GRUB_DEFAULT is C(saved) (C(saved));
      C(held_packages), the kernel packages gpufleet holds
      (C(/var/lib/gpufleet/kernel-holds), driver_kernel_updates C(held)).
  returned: always
  type: dict
signing_key:
  description: The serial of O(signing_certificate), as modules name it; null without one.
  returned: always
  type: str
  sample: 2E88CDFACFD1CF9A8CABD3EFE9BE352373235BFD
driver_version:
  description: The version the module was held to; empty when the node has no driver.
  returned: always
  type: str
  sample: 535.261.03
target:
  description:
    - The kernel the node boots next without gpufleet's hold (C(release); the same as
      kernel.boot_next where it holds nothing) and what it lacks (C(problems)). Under a
      hold (kernel.grub.held), an empty C(problems) means the hold can be lifted.
  returned: always
  type: dict
hold:
  description:
    - Where the target lacks the driver's module and another installed kernel has it
      and a GRUB entry (and GRUB's menu can be written), the hold that keeps the node on
      that one - C(release), and the settings file (C(path), C(content)) that makes its
      entry GRUB's default once the menu is written anew; null otherwise. With
      C(grubby), C(path) and C(content) are gpufleet's record of the hold, and
      C(set_default) the command that makes that kernel the boot default.
  returned: always
  type: dict
hold_blocked:
  description:
    - Where a kernel to hold the node on has the module, but a settings file read after
      gpufleet's hold file sets another GRUB_DEFAULT (which would win), or GRUB_DEFAULT
      is not C(saved) where grubby sets the default, why no hold is offered, naming the
      kernel and the files; null otherwise.
  returned: always
  type: str
regenerate:
  description: The command that writes GRUB's menu anew (C(update-grub), else
    C(grub-mkconfig -o) the menu); null where GRUB's menu lists no kernels.
  returned: always
  type: list
  elements: str
lift:
  description:
    - With C(grubby), under a hold, what lifting it gives back - the command that makes
      the kernel held back the boot default again (C(set_default), null where that
      kernel is gone) and the site's UPDATEDEFAULT (C(updatedefault), empty where its
      file did not set one); null otherwise.
  returned: always
  type: dict
problems:
  description: What is wrong with the kernel that boots next, one sentence each; empty
    when it has the driver's module, when no kernel image is installed, or when the
    node has no driver.
  returned: always
  type: list
  elements: str
  sample:
    - kernel 6.1.0-41-amd64 is installed and would boot next, but has no nvidia module
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils import bls, discovery, grub, kernels


def main():
    module = AnsibleModule(
        argument_spec={
            "driver_version": {"type": "str", "default": ""},
            "signing_certificate": {"type": "path"},
        },
        supports_check_mode=True,
    )

    def run(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    signing_key = None
    certificate = module.params["signing_certificate"]
    if certificate and module.check_mode and not os.path.exists(certificate):
        # A check run that would write it first: it is not there to read yet.
        module.warn(f"{certificate} is not written yet: module signatures not checked")
        certificate = None
    if certificate:
        openssl = module.get_bin_path("openssl", required=True)
        signing_key, why = kernels.certificate_serial(run, openssl, certificate)
        if not signing_key:
            module.fail_json(
                msg=f"signing_certificate: cannot read the certificate {certificate}: {why}"
            )

    version = module.params["driver_version"]
    if not version:
        installed = discovery.installed_driver(run, module.get_bin_path) or {}
        version = installed.get("version") or ""
    kernel = kernels.read(run, module.get_bin_path)
    module.exit_json(
        changed=False,
        kernel=kernel,
        driver_version=version,
        signing_key=signing_key,
        problems=kernels.problems(kernel, version, signing_key),
        **_hold(module, kernel, version, signing_key),
    )


def _hold(module, kernel, version, signing_key):
    """target, hold, hold_blocked and regenerate (see RETURN)."""
    facts = kernel["grub"]
    release = facts["unheld"] if facts["held"] else kernel["boot_next"]
    wrong = kernels.problems(kernel, version, signing_key, release)
    keep = kernels.fallback(kernel, version, signing_key) if wrong else None
    if facts.get("method") == "grubby":
        return _hold_bls(module, kernel, release, wrong, keep)
    hold = blocked = None
    # Settings files read after gpufleet's hold file that set another default.
    entry = facts["entries"][keep] if keep else None
    overriding = sorted(path for path, default in facts["read_after"].items() if default != entry)
    if keep and overriding:
        # grub-mkconfig would read the site's default after gpufleet's: no hold can take.
        blocked = (
            f"kernel {keep} has the module, but GRUB_DEFAULT in {', '.join(overriding)}, read"
            f" after {facts['hold_file']}, would override a hold on it"
        )
    elif keep:
        reason = "; ".join(wrong).replace("\n", " ")
        content = grub.hold_text(facts["entries"][keep], keep, reason)
        hold = {"release": keep, "path": facts["hold_file"], "content": content}
    update_grub = module.get_bin_path("update-grub")
    mkconfig = module.get_bin_path("grub-mkconfig") or module.get_bin_path("grub2-mkconfig")
    regenerate = None
    if facts["config"] and (update_grub or mkconfig):
        regenerate = [update_grub] if update_grub else [mkconfig, "-o", facts["config"]]
    return {
        "target": {"release": release, "problems": wrong},
        "hold": hold if regenerate else None,
        "hold_blocked": blocked,
        "regenerate": regenerate,
        "lift": None,
    }


def _hold_bls(module, kernel, release, wrong, keep):
    """_hold's answer where the node boots BLS entries (RHEL): grubby sets the boot
    default (hold.set_default), gpufleet's record keeps what the hold changed, and a
    hold is lifted by giving the default back (lift.set_default) and the site's
    UPDATEDEFAULT (lift.updatedefault)."""
    facts = kernel["grub"]
    grubby = module.get_bin_path("grubby")
    hold = blocked = lift = None
    if keep and not facts["saved"]:
        blocked = (
            f"kernel {keep} has the module, but GRUB_DEFAULT is not 'saved', so GRUB would"
            " not boot the default grubby sets"
        )
    elif keep and grubby:
        reason = "; ".join(wrong).replace("\n", " ")
        content = bls.hold_text(keep, release, facts["site_updatedefault"], reason)
        hold = {
            "release": keep,
            "path": facts["hold_file"],
            "content": content,
            "set_default": [grubby, "--set-default", f"/boot/vmlinuz-{keep}"],
        }
    if facts["held"] and grubby:
        unheld = facts["unheld"]
        back = unheld in kernel["installed"] and unheld != facts["held"]
        lift = {
            "set_default": [grubby, "--set-default", f"/boot/vmlinuz-{unheld}"] if back else None,
            "updatedefault": facts["site_updatedefault"] or "",
        }
    return {
        "target": {"release": release, "problems": wrong},
        "hold": hold,
        "hold_blocked": blocked,
        "regenerate": None,
        "lift": lift,
    }


if __name__ == "__main__":
    main()
