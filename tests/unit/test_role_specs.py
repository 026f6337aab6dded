# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every role validates its variables, and its spec agrees with its defaults."""

from __future__ import annotations

import pytest
import yaml

from conftest import PROJECT

ROLES = sorted(p.parent.parent.name for p in PROJECT.glob("roles/*/meta/argument_specs.yml"))


def test_every_role_has_an_argument_spec():
    roles = sorted(p.name for p in (PROJECT / "roles").iterdir() if p.is_dir())
    assert roles == ROLES


@pytest.mark.parametrize("role", ROLES)
def test_spec_and_defaults_agree_on_names_and_values(role):
    base = PROJECT / "roles" / role
    defaults = yaml.safe_load((base / "defaults" / "main.yml").read_text()) or {}
    options = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text())["argument_specs"][
        "main"
    ]["options"]
    assert set(defaults) == set(options)
    for name, spec in options.items():
        assert spec.get("default") == defaults[name], name
        assert spec.get("description"), f"{name} has no description"
        assert name.startswith(f"{role}_"), f"{name} is not prefixed with {role}_"
