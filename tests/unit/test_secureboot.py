# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The certificates a Secure Boot node trusts for modules (shim's MOK list and the
firmware's db, as EFI signature lists) and a site certificate's fingerprint, checked
against what openssl says of the same certificate."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import secureboot
from conftest import efi_signature_list, make_certificate

SHA256_TYPE = uuid.UUID("c1c41626-504c-4092-aca9-41f936934328").bytes_le


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certificate(tmp_path_factory.mktemp("mok"), "site module signing")


def test_the_fingerprint_is_openssls(certificate: Path) -> None:
    said = subprocess.run(
        ["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(certificate)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    expected = said.split("=", 1)[1].strip().replace(":", "").lower()
    assert secureboot.pem_fingerprint(certificate.read_text()) == expected
    assert secureboot.pem_fingerprint("-----BEGIN CERTIFICATE-----\n!!\n") is None
    assert secureboot.pem_fingerprint("") is None


def _der(certificate: Path) -> bytes:
    return subprocess.run(
        ["openssl", "x509", "-outform", "DER", "-in", str(certificate)],
        check=True,
        capture_output=True,
    ).stdout


def test_certificates_are_read_from_signature_lists_and_hashes_skipped(
    certificate: Path, tmp_path: Path
) -> None:
    der = _der(certificate)
    other = _der(make_certificate(tmp_path, "distribution key"))
    hashes = efi_signature_list([b"\x11" * 32, b"\x22" * 32], SHA256_TYPE)
    data = efi_signature_list([der]) + efi_signature_list([other]) + hashes
    data += efi_signature_list([der])
    assert secureboot.certificates(data) == [der, other, der]
    assert secureboot.certificates(data[:-10]) == [der, other]  # the last list cut short
    assert secureboot.certificates(b"") == []


def test_enrolled_keys_are_shims_list_and_the_firmwares_db(
    certificate: Path, tmp_path: Path
) -> None:
    site = _der(certificate)
    vendor = _der(make_certificate(tmp_path, "vendor key"))
    efi = tmp_path / "efi"
    efivars = efi / "efivars"
    efivars.mkdir(parents=True)
    attributes = b"\x06\x00\x00\x00"
    (efivars / f"MokListRT-{secureboot.SHIM_GUID}").write_bytes(
        attributes + efi_signature_list([site])
    )
    (efivars / f"db-{secureboot.IMAGE_SECURITY_GUID}").write_bytes(
        attributes + efi_signature_list([vendor])
    )
    # A variable of that name under another GUID is not the MOK list.
    (efivars / "MokListRT-00000000-0000-0000-0000-000000000000").write_bytes(
        attributes + efi_signature_list([_der(make_certificate(tmp_path, "stray"))])
    )
    fingerprints = sorted([secureboot.fingerprint(site), secureboot.fingerprint(vendor)])
    assert secureboot.enrolled(str(efi)) == fingerprints
    # Where the kernel publishes shim's lists itself (no attribute bytes).
    mok = tmp_path / "efi2" / "mok-variables"
    mok.mkdir(parents=True)
    (mok / "MokListRT").write_bytes(efi_signature_list([site]))
    assert secureboot.enrolled(str(mok.parent)) == [secureboot.fingerprint(site)]
    assert secureboot.enrolled(str(tmp_path / "no-efi")) == []
