# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""No role variable is left for a stage to refuse on its own (issue 44).

The settings pass (`settings.check`, run by playbooks/settings.yml before any host is
touched, and by the reconciler) must judge every variable every role's argument spec
lists: a variable it does not judge is one a stage refuses only when it starts, after
the stages before it have changed the node. These tests read the specs, so a variable
added to one is held to this at once.
"""

from __future__ import annotations

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.module_utils import settings
from conftest import PROJECT

SPECS = sorted(PROJECT.glob("roles/*/meta/argument_specs.yml"))
ROLES = [path.parent.parent.name for path in SPECS]


def _options(role):
    spec = yaml.safe_load((PROJECT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"]


def _every_option():
    return {name: option for role in ROLES for name, option in _options(role).items()}


@pytest.mark.parametrize("role", ROLES)
def test_the_settings_pass_judges_every_variable_of_the_role(role):
    unjudged = [
        f"{name} ({option.get('type', 'str')})"
        for name, option in _options(role).items()
        if not settings.coverage(name, option)
    ]
    assert not unjudged, (
        f"roles/{role}/meta/argument_specs.yml has variables the settings pass judges by their "
        f"kind only: {', '.join(unjudged)}. Give each its form in RULES or a check of its "
        "own (OWN_CHECKS) in plugins/module_utils/settings.py; only where nothing before "
        "the run can judge it, an entry in FREE_FORM saying why."
    )


# A value of the wrong kind for each spec type, as users write them: a bare number for
# a string, -e NAME=VALUE's strings for the rest.
WRONG_KIND = {"str": 42, "path": 42, "int": "42", "bool": "false", "list": "a,b", "dict": "a=b"}


@pytest.mark.parametrize("role", ROLES)
def test_a_value_of_the_wrong_kind_is_refused_for_every_variable_of_the_role(role):
    """Ansible's argument spec converts such a value (42 to "42", "false" to False) and
    passes it, while the role is given it as written."""
    options = _options(role)
    for name, option in options.items():
        wrong = WRONG_KIND[option.get("type", "str")]
        found = settings.check(options, {name: wrong})
        assert len(found) == 1 and found[0].startswith(f"{name}: expected "), (name, found)
        assert f"got {wrong!r} (" in found[0], found
        if option.get("elements") == "str":
            found = settings.check(options, {name: ["x", 42]})
            assert found and found[0].startswith(f"{name}[1]: expected a string"), (name, found)


@pytest.mark.parametrize("role", ROLES)
def test_the_defaults_pass_the_settings_pass(role):
    defaults = yaml.safe_load((PROJECT / "roles" / role / "defaults" / "main.yml").read_text())
    literal = {k: v for k, v in (defaults or {}).items() if "{{" not in str(v)}
    assert settings.check(_options(role), literal, str(PROJECT / "roles" / role)) == []


def test_every_check_names_a_variable_of_some_role():
    """A check left behind by a renamed variable would leave the new name unjudged."""
    known = set(_every_option())
    for table in ("RULES", "OWN_CHECKS", "FREE_FORM"):
        stale = sorted(set(getattr(settings, table)) - known)
        assert not stale, f"settings.{table} names variables no role has: {stale}"


# One value each check of its own refuses: the check is there, not only its entry.
OWN_CHECK_CASES = {
    "device_plugin_replicas": (
        {"device_plugin_sharing": "none", "device_plugin_replicas": 3},
        "device_plugin_replicas=3 needs device_plugin_sharing",
    ),
    "k8s_manifests_tolerations": (
        {"k8s_manifests_tolerations": [{"key": "k", "effect": "Sometimes"}]},
        "k8s_manifests_tolerations[0]: effect must be one of",
    ),
    "k8s_manifests_hosts": (
        {"k8s_manifests_hosts": ["gpu-9"]},
        "k8s_manifests_hosts: expected hosts gpufleet manages",
    ),
}


def test_every_check_of_its_own_refuses_a_wrong_value():
    assert set(OWN_CHECK_CASES) == set(settings.OWN_CHECKS)
    options = _every_option()
    for name, (values, words) in OWN_CHECK_CASES.items():
        found = settings.check(options, values, managed_hosts={"gpu-1"})
        assert any(words in problem for problem in found), (name, found)


def test_the_variables_left_free_are_few_strings_each_with_its_reason():
    """FREE_FORM is where a variable is judged by its kind alone. Anything but a string
    has a form (a range, a shape) to check; each entry says why nothing before the run
    can judge it. Two at most: a third is a sign to write the check instead."""
    options = _every_option()
    assert len(settings.FREE_FORM) <= 2, sorted(settings.FREE_FORM)
    for name, reason in settings.FREE_FORM.items():
        assert options[name].get("type", "str") == "str", name
        assert "choices" not in options[name], name
        assert len(reason.split()) >= 8, f"FREE_FORM[{name!r}] does not say why: {reason!r}"
