# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fingerprints of the primary keys in an OpenPGP public key file.

Enough of the packet format (RFC 4880 section 4, RFC 9580 section 4) to walk a key
file, ASCII-armoured or binary, and fingerprint each public-key packet (tag 6): SHA-1
over 0x99, a two-octet length and the packet body for version 4 keys (RFC 4880 12.2),
SHA-256 over 0x9A/0x9B, a four-octet length and the body for versions 5 and 6
(RFC 9580 5.5.4). Subkeys (tag 14) are bound to their primary key by its signature,
which apt checks; the primary keys are what a repository key is pinned by.

Nothing here verifies a signature: it only names the keys a file holds, so that a
file holding any key not pinned is refused before it is installed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

ARMOR_BEGIN = b"-----BEGIN PGP PUBLIC KEY BLOCK-----"
_ARMOR = re.compile(
    rb"-----BEGIN PGP PUBLIC KEY BLOCK-----[ \t]*\r?\n(.*?)-----END PGP PUBLIC KEY BLOCK-----",
    re.S,
)
_PUBLIC_KEY = 6
_FINGERPRINT_PREFIX = {4: (b"\x99", 2, hashlib.sha1), 5: (b"\x9a", 4, hashlib.sha256)}
_FINGERPRINT_PREFIX[6] = (b"\x9b", 4, hashlib.sha256)


class KeyFileError(ValueError):
    """The data is not an OpenPGP public key file this module can read."""


def is_armoured(data: bytes) -> bool:
    return data.lstrip().startswith(ARMOR_BEGIN)


def dearmour(data: bytes) -> bytes:
    """The binary packets of `data`: decoded from its armour blocks, or as given."""
    if not is_armoured(data):
        return data
    blocks = _ARMOR.findall(data)
    if not blocks:
        raise KeyFileError("an armour block that does not end")
    binary = b""
    for block in blocks:
        lines = block.replace(b"\r", b"").split(b"\n")
        # Armour headers ("Comment: ...") end at the first empty line.
        if b"" in lines and any(b":" in line for line in lines[: lines.index(b"")]):
            lines = lines[lines.index(b"") + 1 :]
        body = b"".join(line.strip() for line in lines if not line.startswith(b"="))
        try:
            binary += base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError) as error:
            raise KeyFileError(f"armour that is not base64 ({error})") from None
    return binary


def _packets(data: bytes):
    """(tag, body) of each packet of `data`."""
    offset = 0
    while offset < len(data):
        ctb = data[offset]
        if not ctb & 0x80:
            raise KeyFileError(f"no packet header at byte {offset}")
        if ctb & 0x40:  # new format: tag in the low six bits, then a length of 1, 2 or 5 octets
            tag = ctb & 0x3F
            first = data[offset + 1] if offset + 1 < len(data) else None
            if first is None:
                raise KeyFileError("a packet header cut short")
            if first < 192:
                length, header = first, 2
            elif first < 224:
                if offset + 2 >= len(data):
                    raise KeyFileError("a packet header cut short")
                length, header = ((first - 192) << 8) + data[offset + 2] + 192, 3
            elif first == 255:
                length, header = int.from_bytes(data[offset + 2 : offset + 6], "big"), 6
            else:  # partial body lengths are for literal and encrypted data only
                raise KeyFileError(f"a partial-length packet (tag {tag}) in a key file")
        else:  # old format: tag in bits 5-2, length type in bits 1-0
            tag = (ctb >> 2) & 0x0F
            size = {0: 1, 1: 2, 2: 4}.get(ctb & 0x03)
            if size is None:
                raise KeyFileError(f"a packet of indeterminate length (tag {tag}) in a key file")
            length = int.from_bytes(data[offset + 1 : offset + 1 + size], "big")
            header = 1 + size
        body = data[offset + header : offset + header + length]
        if len(body) != length:
            raise KeyFileError(f"a packet (tag {tag}) cut short")
        yield tag, body
        offset += header + length


def fingerprints(data: bytes) -> list[str]:
    """Upper-case hex fingerprints of the primary keys in `data`, in file order."""
    found = []
    for tag, body in _packets(dearmour(data)):
        if tag != _PUBLIC_KEY:
            continue
        if not body or body[0] not in _FINGERPRINT_PREFIX:
            version = body[0] if body else "no"
            raise KeyFileError(f"a version {version} public key, which cannot be fingerprinted")
        prefix, size, digest = _FINGERPRINT_PREFIX[body[0]]
        found.append(digest(prefix + len(body).to_bytes(size, "big") + body).hexdigest().upper())
    if not found:
        raise KeyFileError("no public key")
    return found


def normalise(fingerprint: str) -> str:
    """A fingerprint as written by people ("EB69 3B30 ...") in the form of fingerprints()."""
    return re.sub(r"\s+", "", fingerprint).upper()
