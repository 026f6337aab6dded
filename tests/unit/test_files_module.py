# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The files module, run through Ansible on this host, in a temporary directory."""

from __future__ import annotations

import stat
from pathlib import Path

from conftest import run_local_module


def files(entries: list[dict], *flags: str, **options) -> dict:
    return run_local_module("gpufleet.nvidia.files", {"files": entries, **options}, *flags)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_directories_and_removals_are_made_once_and_a_second_run_changes_nothing(tmp_path):
    markers = tmp_path / "run" / "validations"
    (tmp_path / "stale").write_text("old\n")
    wanted = [
        {"path": str(markers / "driver-ready"), "content": "DRIVER=1\n"},
        {"path": str(tmp_path / "plugins"), "state": "directory", "mode": "0750"},
        {"path": str(tmp_path / "stale"), "state": "absent"},
        {"path": str(tmp_path / "never-there"), "state": "absent"},
    ]
    first = files(wanted)
    assert first["changed"] is True
    assert first["changed_paths"] == [e["path"] for e in wanted[:3]]
    assert (markers / "driver-ready").read_text() == "DRIVER=1\n"
    assert mode(markers / "driver-ready") == 0o644
    # The directories above a file are made with directory_mode, whatever the umask.
    assert mode(markers) == mode(markers.parent) == 0o755
    assert mode(tmp_path / "plugins") == 0o750
    assert not (tmp_path / "stale").exists()
    again = files(wanted)
    assert (again["changed"], again["changed_paths"]) == (False, [])


def test_only_the_entries_that_differ_are_written_and_a_mode_alone_is_fixed(tmp_path):
    same, other, loose = tmp_path / "same", tmp_path / "other", tmp_path / "loose"
    for path in (same, other, loose):
        path.write_text("A\n")
        path.chmod(0o644)
    loose.chmod(0o666)
    before = same.stat().st_ino
    result = files(
        [
            {"path": str(same), "content": "A\n"},
            {"path": str(other), "content": "B\n", "mode": "0600"},
            {"path": str(loose), "content": "A\n"},
        ],
        "--diff",
    )
    assert result["changed_paths"] == [str(other), str(loose)]
    assert same.stat().st_ino == before
    assert (other.read_text(), mode(other)) == ("B\n", 0o600)
    assert (loose.read_text(), mode(loose)) == ("A\n", 0o644)
    assert [(d["before"], d["after"]) for d in result["diff"]] == [
        ("A\n", "B\n"),
        ("mode 0666\n", "mode 0644\n"),
    ]
    # Written by renaming a whole file over the old one: nothing half-written is left.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loose", "other", "same"]


def test_check_mode_predicts_every_change_and_makes_none(tmp_path):
    (tmp_path / "marker").write_text("")
    predicted = files(
        [
            {"path": str(tmp_path / "new" / "spec.yaml"), "content": "kind: x\n"},
            {"path": str(tmp_path / "marker"), "state": "absent"},
        ],
        "--check",
        "--diff",
    )
    assert predicted["changed"] is True
    assert predicted["changed_paths"] == [
        str(tmp_path / "new" / "spec.yaml"),
        str(tmp_path / "marker"),
    ]
    assert [d["after"] for d in predicted["diff"]] == ["kind: x\n", "absent\n"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marker"]


def test_bad_entries_are_refused_naming_them_before_anything_is_written(tmp_path):
    (tmp_path / "dir").mkdir()
    first = tmp_path / "first"
    cases = [
        ({"path": "etc/relative"}, "files[1].path: expected an absolute path, got etc/relative"),
        ({"path": str(tmp_path / "x"), "mode": "644a"}, "files[1].mode: expected an octal string"),
        ({"path": str(tmp_path / "dir")}, f"{tmp_path / 'dir'} is a directory, expected a file"),
        ({"path": str(tmp_path / "dir"), "state": "absent"}, "state absent removes only files"),
    ]
    for bad, words in cases:
        result = files([{"path": str(first), "content": "1\n"}, bad])
        assert result.get("failed") is True, bad
        assert words in result["msg"]
        assert not first.exists()
    assert "directory_mode: expected an octal string" in files([], directory_mode="999")["msg"]


def test_no_entries_is_no_change():
    assert files([])["changed"] is False
