# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The certificates a Secure Boot node trusts for kernel modules, and a site key's.

Under Secure Boot, the kernel loads a module signed with a key the firmware's
signature database (`db`) or shim's Machine Owner Key list holds. The firmware
publishes both as UEFI variables made of EFI_SIGNATURE_LISTs (UEFI specification,
"Signature Database"): `db` under the image-security GUID, and shim's copy of the MOK
list for the running system, `MokListRT`, under shim's GUID (split into MokListRT1,
MokListRT2, ... when large). In efivarfs each variable starts with its four attribute
bytes; kernels that read shim's configuration table also publish the MOK lists,
without them, under /sys/firmware/efi/mok-variables. What `mokutil --list-enrolled`
and `--test-key` read is the same list.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import struct
import uuid

SHIM_GUID = "605dab50-e046-4300-abb6-3dd810dd8b23"
IMAGE_SECURITY_GUID = "d719b2cb-3d3a-4596-a3bc-dad00e67656f"
# EFI_CERT_X509_GUID, as the lists store GUIDs (the first three fields little-endian).
X509_TYPE = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072").bytes_le
_LIST_HEADER = struct.Struct("<16sIII")
_OWNER = 16
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)


def certificates(data):
    """The DER certificates (X.509 entries) in a run of EFI_SIGNATURE_LISTs; a list cut
    short or of another type (hashes) adds nothing."""
    found = []
    offset = 0
    while offset + _LIST_HEADER.size <= len(data):
        kind, list_size, header_size, entry_size = _LIST_HEADER.unpack_from(data, offset)
        if list_size < _LIST_HEADER.size or offset + list_size > len(data):
            break
        start = offset + _LIST_HEADER.size + header_size
        end = offset + list_size
        if kind == X509_TYPE and entry_size > _OWNER:
            for entry in range(start, end - entry_size + 1, entry_size):
                found.append(bytes(data[entry + _OWNER : entry + entry_size]))
        offset = end
    return found


def fingerprint(der):
    """A certificate's SHA-256 fingerprint, lower-case hex (what `mokutil --list-enrolled`
    and `openssl x509 -fingerprint -sha256` print, without the colons)."""
    return hashlib.sha256(der).hexdigest()


def pem_fingerprint(text):
    """The fingerprint of the first certificate in PEM `text`; None without a readable
    one."""
    match = _PEM.search(text or "")
    if not match:
        return None
    try:
        der = base64.b64decode("".join(match.group(1).split()), validate=True)
    except (binascii.Error, ValueError):
        return None
    return fingerprint(der) if der else None


def enrolled(efi_dir):
    """The fingerprints of the certificates the node trusts for modules: shim's MOK list
    (MokListRT and its continuations, from efivarfs or mok-variables) and the
    firmware's db; sorted, each once. Empty without EFI or those variables."""
    found = set()
    for name, data in _variables(efi_dir):
        if name.startswith("MokListRT") or name == "db":
            found.update(fingerprint(der) for der in certificates(data))
    return sorted(found)


def _variables(efi_dir):
    """(name, data) of the MOK and db variables under `efi_dir`."""
    efivars = os.path.join(efi_dir, "efivars")
    for name in _listdir(efivars):
        base, _sep, guid = name.partition("-")
        if (base.startswith("MokListRT") and guid == SHIM_GUID) or (
            base == "db" and guid == IMAGE_SECURITY_GUID
        ):
            data = _read(os.path.join(efivars, name))
            if data is not None:
                yield base, data[4:]  # efivarfs puts the attributes first
    mok = os.path.join(efi_dir, "mok-variables")
    for name in _listdir(mok):
        if name.startswith("MokListRT"):
            data = _read(os.path.join(mok, name))
            if data is not None:
                yield name, data


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None
