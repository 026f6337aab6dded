# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Bad driver settings fail before any task touches a host, naming the variable.

Runs the real driver role with ansible-playbook against the local machine, but only
as far as its validation: gpu_facts reads a fixture sysfs tree in tmp_path (read
only) and every case fails before the first task that could change anything.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import efi_signature_list, make_certificate, run_ansible

PLAYBOOK = """
- name: One node role against a fixture node
  hosts: {hosts}
  connection: local
  gather_facts: false
  pre_tasks:
    - name: Discover the fixture node's GPUs, as site.yml's first play does
      gpufleet.nvidia.gpu_facts:
        sysfs_root: "{{{{ gpufleet_sysfs_root }}}}"
        query_driver: false
  roles:
    - role: {role}
"""


def _gpu(root: Path, address: str, device: str) -> None:
    path = root / "bus" / "pci" / "devices" / address
    path.mkdir(parents=True)
    for name, value in (
        ("vendor", "0x10de"),
        ("device", device),
        ("class", "0x030200"),
        ("numa_node", "0"),
    ):
        (path / name).write_text(value + "\n")


def _fixture_node(
    root: Path, device: str, secure_boot: bool = False, enrolled: bytes = b""
) -> Path:
    """A sysfs tree under `root` with one GPU of PCI `device`, and Secure Boot on or off;
    `enrolled`: the DER certificate in shim's Machine Owner Key list, if any."""
    sysfs = root / "sys"
    _gpu(sysfs, "0000:18:00.0", device)
    efivars = sysfs / "firmware" / "efi" / "efivars"
    efivars.mkdir(parents=True)
    (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(
        b"\x06\x00\x00\x00" + (b"\x01" if secure_boot else b"\x00")
    )
    if enrolled:
        (efivars / "MokListRT-605dab50-e046-4300-abb6-3dd810dd8b23").write_bytes(
            b"\x06\x00\x00\x00" + efi_signature_list([enrolled])
        )
    return sysfs


def run_role(
    tmp_path: Path,
    role: str,
    device: str,
    secure_boot: bool = False,
    enrolled: bytes = b"",
    **variables: object,
):
    """`role` on this machine, seen as a node with one GPU of PCI `device`."""
    sysfs = _fixture_node(tmp_path, device, secure_boot, enrolled)
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(role=role, hosts="localhost"))
    extra = {
        "gpufleet_sysfs_root": str(sysfs),
        "ansible_python_interpreter": sys.executable,
        **variables,
    }
    # --check as a second guard: should a case get past validation, it still
    # changes nothing on this machine.
    return run_ansible(
        "ansible-playbook", "--check", "-i", "localhost,", str(playbook), "-e", json.dumps(extra)
    )


def run_role_cases(tmp_path: Path, role: str, cases: dict[str, tuple[str, dict]]):
    """`role` in one ansible-playbook run (check mode) over one inventory host per case,
    each this machine seen as a node with one GPU: name -> (PCI device, its variables,
    as host variables). The cases fail or pass each on its own host."""
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "gpufleet_sysfs_root": str(_fixture_node(tmp_path / name, device)),
            **variables,
        }
        for name, (device, variables) in cases.items()
    }
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(role=role, hosts="all"))
    return run_ansible("ansible-playbook", "--check", "-i", str(inventory), str(playbook))


def run_driver_role(tmp_path: Path, device: str, secure_boot: bool = False, **variables: object):
    return run_role(tmp_path, "driver", device, secure_boot, **variables)


def failure(report, host: str = "localhost") -> str:
    """The name and message of the task that failed on `host`."""
    for play in report["plays"]:
        for task in play["tasks"]:
            outcome = task["hosts"].get(host, {})
            if outcome.get("failed"):
                return task["task"]["name"] + ": " + outcome.get("msg", "")
    raise AssertionError(f"nothing failed on {host}")


BAD_SETTINGS = [
    ("0x2330", {"driver_source": "ppa"}, "driver_source"),
    ("0x2330", {"driver_hold_packages": "sometimes"}, "driver_hold_packages"),
    ("0x2330", {"driver_reboot_policy": "always"}, "driver_reboot_policy"),
    ("0x2330", {"driver_kernel_updates": "frozen"}, "driver_kernel_updates"),
    ("0x2330", {"driver_branch": "53x"}, "driver_branch: expected a three-digit"),
    (
        "0x2330",
        {"driver_version": "535.261.03", "driver_branch": "550", "driver_source": "cuda-repo"},
        "is not of driver_branch 550",
    ),
    # A V100 (Volta) cannot run the open kernel modules.
    ("0x1db4", {"driver_kernel_module_type": "open"}, "driver_kernel_module_type: open"),
]


@pytest.fixture(scope="module")
def bad_settings_run(tmp_path_factory):
    """The driver role run once over every case of BAD_SETTINGS, one host each."""
    cases = {
        f"case-{i}": (device, variables) for i, (device, variables, _) in enumerate(BAD_SETTINGS)
    }
    return run_role_cases(tmp_path_factory.mktemp("driver"), "driver", cases)


@pytest.mark.parametrize("case", range(len(BAD_SETTINGS)), ids=lambda i: BAD_SETTINGS[i][2])
def test_bad_settings_fail_before_any_change(bad_settings_run, case):
    _rc, report = bad_settings_run
    host = f"case-{case}"
    assert BAD_SETTINGS[case][2] in failure(report, host)
    assert report["stats"][host]["failures"] == 1
    assert report["stats"][host]["changed"] == 0


def test_secure_boot_without_signed_modules_fails_with_the_way_forward(tmp_path):
    rc, report = run_driver_role(tmp_path, "0x2330", secure_boot=True)
    assert rc != 0
    message = failure(report)
    assert "Secure Boot is enabled" in message
    assert "Machine Owner Key" in message and "driver_secure_boot_signed_modules" in message
    assert "driver_secure_boot_signing_key" in message
    assert report["stats"]["localhost"]["changed"] == 0


def outcome(report, name: str) -> dict:
    for play in report["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].endswith(name):
                return task["hosts"]["localhost"]
    raise AssertionError(f"no task {name!r} ran")


def _site_key(tmp_path: Path) -> tuple[str, str, bytes]:
    """A Machine Owner Key of the site's: (key PEM, certificate PEM, certificate DER)."""
    certificate = make_certificate(tmp_path, "site module signing")
    der = subprocess.run(
        ["openssl", "x509", "-outform", "DER", "-in", str(certificate)],
        check=True,
        capture_output=True,
    ).stdout
    key = (tmp_path / "site module signing.key").read_text()
    return key, certificate.read_text(), der


def test_secure_boot_with_the_sites_enrolled_signing_key_is_not_refused(tmp_path):
    """The site's Machine Owner Key handed in and enrolled (check mode writes nothing):
    DKMS will sign with it, so the Secure Boot checks let the install go on, and the
    key's file is predicted without its text in the output."""
    key, certificate, der = _site_key(tmp_path)
    _rc, report = run_driver_role(
        tmp_path,
        "0x2330",
        secure_boot=True,
        enrolled=der,
        driver_secure_boot_signing_key=key,
        driver_secure_boot_signing_certificate=certificate,
    )
    checked = outcome(report, "Refuse to install unsigned modules under Secure Boot")
    assert not checked.get("failed"), checked
    trusted = outcome(report, "Refuse a module-signing key the node's firmware does not trust")
    assert not trusted.get("failed") and not trusted.get("skipped"), trusted
    written = outcome(report, "Write the module-signing key")
    body = key.splitlines()[1]
    assert written.get("changed") and body not in json.dumps(written), written


def test_a_signing_key_the_firmware_does_not_trust_is_refused_with_the_enrolment_steps(
    tmp_path,
):
    key, certificate, _der = _site_key(tmp_path)
    other = subprocess.run(
        ["openssl", "x509", "-outform", "DER", "-in", str(make_certificate(tmp_path, "old"))],
        check=True,
        capture_output=True,
    ).stdout
    rc, report = run_driver_role(
        tmp_path,
        "0x2330",
        secure_boot=True,
        enrolled=other,
        driver_secure_boot_signing_key=key,
        driver_secure_boot_signing_certificate=certificate,
    )
    assert rc != 0
    message = " ".join(failure(report).split())
    fingerprint = hashlib.sha256(_der).hexdigest()
    assert (
        "Secure Boot is enabled on localhost, but the certificate in "
        f"driver_secure_boot_signing_certificate (SHA-256 {fingerprint}) is not enrolled"
    ) in message, message
    assert "mokutil --import mok.der" in message
    assert report["stats"]["localhost"]["changed"] == 0


def test_a_blackwell_gpu_where_the_source_offers_no_branch_for_it_is_refused(tmp_path):
    """A B200 on this Debian 12 machine with Debian's own packages (535 alone): no
    default branch runs it, and the refusal names the GPU and what it needs."""
    rc, report = run_driver_role(tmp_path, "0x2901")
    assert rc != 0
    assert (
        "the node's package source offers branch(es) 535, none of which runs every GPU "
        "of the node (GPU 0000:18:00.0 (NVIDIA B200): Blackwell GPUs need branch 570 or newer)"
    ) in failure(report)
    assert report["stats"]["localhost"]["changed"] == 0
