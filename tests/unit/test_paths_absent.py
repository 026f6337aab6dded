# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The paths_absent module, run through Ansible on this host, in a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_local_module


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """A file, a directory with a file in it, a dangling link, a link to a kept file,
    and a path that does not exist."""
    kept = tmp_path / "kept.conf"
    kept.write_text("kept\n")
    (tmp_path / "signing").mkdir()
    (tmp_path / "signing" / "mok.key").write_text("key\n")
    (tmp_path / "gpufleet.pref").write_text("Pin: version 535.*\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "link").symlink_to(kept)
    names = ["gpufleet.pref", "signing", "dangling", "link", "never-there"]
    return {"kept": kept, **{name: tmp_path / name for name in names}}


def absent(paths: list[Path], *flags: str) -> dict:
    return run_local_module(
        "gpufleet.nvidia.paths_absent", {"paths": [str(p) for p in paths]}, *flags
    )


def test_what_exists_is_removed_once_and_a_second_run_changes_nothing(tree):
    paths = [tree[n] for n in ("gpufleet.pref", "signing", "dangling", "link", "never-there")]
    first = absent(paths)
    assert first["changed"] is True
    assert first["removed"] == [str(p) for p in paths[:4]]
    assert not any(p.exists() or p.is_symlink() for p in paths)
    # A link goes, not what it points to.
    assert tree["kept"].read_text() == "kept\n"
    again = absent(paths)
    assert (again["changed"], again["removed"]) == (False, [])


def test_check_mode_predicts_the_removals_and_makes_none(tree):
    paths = [tree["gpufleet.pref"], tree["signing"], tree["never-there"]]
    predicted = absent(paths, "--check", "--diff")
    assert (predicted["changed"], predicted["removed"]) == (True, [str(p) for p in paths[:2]])
    assert [d["before"] for d in predicted["diff"]] == ["present\n", "present\n"]
    assert tree["gpufleet.pref"].is_file() and (tree["signing"] / "mok.key").is_file()


def test_a_relative_path_is_refused_before_anything_is_removed(tree):
    result = absent([tree["gpufleet.pref"], Path("etc/apt/preferences.d/x.pref")])
    assert result.get("failed") is True
    assert "expected absolute paths, got etc/apt/preferences.d/x.pref" in result["msg"]
    assert tree["gpufleet.pref"].is_file()


def test_no_paths_is_no_change():
    assert absent([])["changed"] is False
