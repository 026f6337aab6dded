# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Repository signing keys pinned by fingerprint (module repo_key, module_utils openpgp).

The fingerprints we compute are compared with GnuPG's own, for keys GnuPG generates
here and for the Debian archive keyrings of this machine; the module is then run
through Ansible against key files served from file: URLs.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import openpgp
from conftest import run_local_module


def _gpg(home: Path, *args: str) -> bytes:
    return subprocess.run(
        ["gpg", "--batch", "--homedir", str(home), *args],
        check=True,
        capture_output=True,
    ).stdout


def _gpg_fingerprints(home: Path, key_file: Path) -> list[str]:
    """GnuPG's fingerprints of the primary keys in a file (not imported anywhere)."""
    listing = _gpg(home, "--with-colons", "--show-keys", str(key_file)).decode()
    # The first "fpr" record after a "pub" record is the primary key's.
    found, wanted = [], False
    for record in listing.splitlines():
        kind = record.split(":")[0]
        if kind == "pub":
            wanted = True
        elif kind == "fpr" and wanted:
            found.append(record.split(":")[9])
            wanted = False
    return found


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Key files GnuPG writes: one RSA and one Ed25519 key, armoured and binary, and both."""
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    out = tmp_path_factory.mktemp("keys")
    files = {}
    for name, algo in (("rsa", "rsa3072"), ("ed25519", "ed25519")):
        uid = f"gpufleet {name} <{name}@example.invalid>"
        _gpg(home, "--passphrase", "", "--quick-gen-key", uid, algo, "sign", "never")
        (out / f"{name}.asc").write_bytes(_gpg(home, "--armor", "--export", uid))
        (out / f"{name}.gpg").write_bytes(_gpg(home, "--export", uid))
        files[name] = out / f"{name}.asc"
        files[f"{name}-binary"] = out / f"{name}.gpg"
    both = out / "both.asc"
    both.write_bytes((out / "rsa.asc").read_bytes() + (out / "ed25519.asc").read_bytes())
    files["both"] = both
    files["home"] = home
    return files


@pytest.mark.parametrize("name", ["rsa", "rsa-binary", "ed25519", "ed25519-binary", "both"])
def test_fingerprints_are_gnupgs(keys, name):
    ours = openpgp.fingerprints(keys[name].read_bytes())
    assert ours == _gpg_fingerprints(keys["home"], keys[name])
    assert len(ours) == (2 if name == "both" else 1)


KEYRINGS = sorted(Path("/usr/share/keyrings").glob("debian-archive-*.gpg"))


def test_fingerprints_of_the_debian_archive_keyrings_are_gnupgs(keys):
    # Real keyrings (Debian's debian-archive-keyring), many keys each, written by other
    # tools than the GnuPG above.
    assert KEYRINGS, "debian-archive-keyring is part of every Debian system"
    for keyring in KEYRINGS:
        assert openpgp.fingerprints(keyring.read_bytes()) == _gpg_fingerprints(
            keys["home"], keyring
        ), keyring


def _new_format(binary: bytes) -> bytes:
    """The same packets with new-format headers (as other OpenPGP tools write them)."""
    out, offset = b"", 0
    while offset < len(binary):
        ctb = binary[offset]
        size = {0: 1, 1: 2, 2: 4}[ctb & 3]
        length = int.from_bytes(binary[offset + 1 : offset + 1 + size], "big")
        body = binary[offset + 1 + size : offset + 1 + size + length]
        tag = (ctb >> 2) & 0x0F
        if length < 192:
            header = bytes([0xC0 | tag, length])
        elif length < 8384:
            header = bytes([0xC0 | tag, ((length - 192) >> 8) + 192, (length - 192) & 0xFF])
        else:
            header = bytes([0xC0 | tag, 255]) + length.to_bytes(4, "big")
        out += header + body
        offset += 1 + size + length
    return out


def test_new_format_packet_headers_give_the_same_fingerprints(keys):
    for name in ("rsa-binary", "ed25519-binary"):
        binary = keys[name].read_bytes()
        assert binary[0] & 0x40 == 0  # GnuPG writes old-format headers for keys
        assert openpgp.fingerprints(_new_format(binary)) == openpgp.fingerprints(binary)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "no public key"),
        (b"<html>Not Found</html>", "no packet header"),
        (b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQGN\n", "does not end"),
        (
            b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n!!!!\n-----END PGP PUBLIC KEY BLOCK-----\n",
            "not base64",
        ),
    ],
)
def test_what_is_not_a_key_file_is_said_so(data, words):
    with pytest.raises(openpgp.KeyFileError, match=words):
        openpgp.fingerprints(data)


def test_a_key_file_cut_short_is_refused(keys):
    binary = keys["rsa-binary"].read_bytes()
    with pytest.raises(openpgp.KeyFileError, match="cut short"):
        openpgp.fingerprints(binary[: len(binary) // 2])


# --- the module ----------------------------------------------------------------------


def _install(keys, tmp_path, source="rsa", pins=None, *flags, dest_name="repo.asc"):
    pins = pins if pins is not None else openpgp.fingerprints(keys[source].read_bytes())
    args = {
        "url": f"file://{keys[source]}",
        "dest": str(tmp_path / dest_name),
        "fingerprints": pins,
        "setting": "toolkit_repo_key_fingerprints",
    }
    return run_local_module("gpufleet.nvidia.repo_key", args, *flags)


def test_the_pinned_key_is_installed_once_and_check_mode_predicts_it(keys, tmp_path):
    dest = tmp_path / "repo.asc"
    predicted = _install(keys, tmp_path, "rsa", None, "--check")
    assert predicted["changed"] is True and not dest.exists()

    first = _install(keys, tmp_path)
    assert first["changed"] is True
    assert dest.read_bytes() == keys["rsa"].read_bytes()
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o644

    again = _install(keys, tmp_path)
    assert again["changed"] is False
    assert _install(keys, tmp_path, "rsa", None, "--check")["changed"] is False


def test_pins_are_read_as_people_write_them(keys, tmp_path):
    (fingerprint,) = openpgp.fingerprints(keys["rsa"].read_bytes())
    spaced = " ".join(fingerprint[i : i + 4] for i in range(0, 40, 4)).lower()
    assert _install(keys, tmp_path, "rsa", [spaced])["changed"] is True


def test_a_key_that_is_not_pinned_is_refused_and_the_installed_one_kept(keys, tmp_path):
    dest = tmp_path / "repo.asc"
    _install(keys, tmp_path, "rsa")
    trusted = dest.read_bytes()
    (pinned,) = openpgp.fingerprints(trusted)
    (other,) = openpgp.fingerprints(keys["ed25519"].read_bytes())

    # The server now serves another key under the same URL.
    swapped = _install(keys, tmp_path, "ed25519", [pinned])
    assert swapped.get("failed") is True
    assert other in swapped["msg"] and pinned in swapped["msg"]
    assert "toolkit_repo_key_fingerprints" in swapped["msg"]
    assert dest.read_bytes() == trusted
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".repo_key-")]

    # A file holding the pinned key and another one is refused too.
    extra = _install(keys, tmp_path, "both", [pinned])
    assert extra.get("failed") is True and other in extra["msg"]
    assert dest.read_bytes() == trusted


def test_a_binary_key_is_not_written_to_an_asc_file(keys, tmp_path):
    refused = _install(keys, tmp_path, "rsa-binary")
    assert refused.get("failed") is True and ".gpg" in refused["msg"]
    assert not (tmp_path / "repo.asc").exists()
    assert _install(keys, tmp_path, "rsa-binary", None, dest_name="repo.gpg")["changed"] is True


def test_a_url_that_serves_no_key_fails_naming_it(tmp_path, keys):
    page = tmp_path / "index.html"
    page.write_text("<html>moved</html>")
    args = {
        "url": f"file://{page}",
        "dest": str(tmp_path / "repo.asc"),
        "fingerprints": ["0" * 40],
    }
    result = run_local_module("gpufleet.nvidia.repo_key", args)
    assert result.get("failed") is True
    assert str(page) in result["msg"] and "not an OpenPGP public key file" in result["msg"]
    assert not (tmp_path / "repo.asc").exists()
