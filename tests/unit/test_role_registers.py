# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""No task registers its result under the name of one of its role's variables.

A registered result outranks role vars and defaults for the rest of the play, also
where the task was skipped: the variable becomes a dict, true in any expression that
reads it afterwards (the runtime_config role once recorded python3-tomlkit as one of
its packages on nodes that did not need it this way).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"


def registers(tasks: object) -> Iterator[str]:
    """Every register name in a task list, blocks and their rescues included."""
    if not isinstance(tasks, list):
        return
    for task in tasks:
        if not isinstance(task, dict):
            continue
        if isinstance(task.get("register"), str):
            yield task["register"]
        for section in ("block", "rescue", "always"):
            yield from registers(task.get(section))


def role_variables(role: Path) -> set[str]:
    names: set[str] = set()
    for kind in ("vars", "defaults"):
        for file in sorted((role / kind).glob("*.yml")):
            names |= set(yaml.safe_load(file.read_text()) or {})
    return names


@pytest.mark.parametrize("role", sorted(p.name for p in ROLES.iterdir() if (p / "tasks").is_dir()))
def test_no_register_shadows_a_role_variable(role: str) -> None:
    variables = role_variables(ROLES / role)
    assert variables, role  # the role's variables were read
    shadowing = [
        f"{file.relative_to(ROLES)}: register {name}"
        for kind in ("tasks", "handlers")
        for file in sorted((ROLES / role / kind).glob("*.yml"))
        for name in registers(yaml.safe_load(file.read_text()))
        if name in variables
    ]
    assert not shadowing
