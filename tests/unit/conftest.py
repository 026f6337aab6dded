"""Make the collection, the simulation kit and the fleet tool importable in unit tests."""

from __future__ import annotations

import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
for path in (PROJECT / "collections", PROJECT / "tests" / "sim" / "kit", PROJECT / "tests" / "sim"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

FIXTURES = Path(__file__).parent / "fixtures"


def run_ansible(command: str, *args: str) -> tuple[int, dict]:
    """Run `ansible` or `ansible-playbook` of this venv with the project's config.

    Returns the exit code and the JSON report (ansible.posix.json callback).
    """
    import json
    import os
    import subprocess

    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_NOCOLOR="1",
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / command), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT,
        check=False,
    )
    return result.returncode, json.loads(result.stdout)


def run_local_module(module: str, args: dict, *flags: str) -> dict:
    """Run one of our modules on this host through `ansible`; returns its result."""
    import json

    _rc, report = run_ansible(
        "ansible",
        "localhost",
        "-c",
        "local",
        "-e",
        json.dumps({"ansible_python_interpreter": sys.executable}),
        "-m",
        module,
        "-a",
        json.dumps(args),
        *flags,
    )
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]
