# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The per-role reference pages in docs/roles are generated from the roles' argument
specs (tests/tools/role_docs.py): a spec changed without its page fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parents[2]
TOOL = PROJECT / "tests" / "tools" / "role_docs.py"


def test_every_role_page_is_what_its_argument_spec_says() -> None:
    result = subprocess.run(
        [sys.executable, str(TOOL), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr + "\nrun: python tests/tools/role_docs.py"


def test_every_variable_of_every_role_is_on_its_page() -> None:
    for spec_file in sorted(PROJECT.glob("roles/*/meta/argument_specs.yml")):
        role = spec_file.parent.parent.name
        page = (PROJECT / "docs" / "roles" / f"{role}.md").read_text()
        specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
        for entry in specs.values():
            for name in entry.get("options") or {}:
                assert f"| `{name}` |" in page, (role, name)


def test_every_relative_link_in_the_docs_resolves() -> None:
    import re

    pages = [PROJECT / "README.md", *PROJECT.glob("docs/*.md"), *PROJECT.glob("roles/*/README.md")]
    broken = [
        f"{page.relative_to(PROJECT)}: {target}"
        for page in pages
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
        if not target.startswith(("http://", "https://"))
        and not (page.parent / target).resolve().exists()
    ]
    assert not broken, broken


def test_the_variables_a_role_page_explains_are_the_roles() -> None:
    """roles/<role>/README.md explains its main settings by hand (what they do; types
    and defaults are in the generated page): every variable it names is in the spec."""
    import re

    for readme in sorted(PROJECT.glob("roles/*/README.md")):
        spec = yaml.safe_load((readme.parent / "meta" / "argument_specs.yml").read_text())
        known = {n for entry in spec["argument_specs"].values() for n in entry.get("options") or {}}
        for row in re.findall(r"(?m)^\| (`[^|]*`) \|", readme.read_text()):
            for name in re.findall(r"`([a-z0-9_]+)`", row):
                if name.startswith(readme.parent.name.split("_")[0]):
                    assert name in known, f"{readme.relative_to(PROJECT)}: {name}"
