"""`python -m runner` works from the start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runner import __version__, cli


def test_help_exits_zero_and_says_how_to_converge(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    assert "ansible-playbook site.yml" in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert __version__ in capsys.readouterr().out


def test_module_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "runner", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert result.stdout.startswith("usage: python -m runner")


def test_unknown_option_is_an_error_in_words():
    result = subprocess.run(
        [sys.executable, "-m", "runner", "--frobnicate"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "unrecognized arguments: --frobnicate" in result.stderr
