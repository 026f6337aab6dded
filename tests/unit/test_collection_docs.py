# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every module of the collection has documentation that ansible-doc renders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROJECT

MODULES = sorted(
    p.stem
    for p in (PROJECT / "collections/ansible_collections/gpufleet/nvidia/plugins/modules").glob(
        "*.py"
    )
)


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_renders_the_module_with_examples(module):
    name = f"gpufleet.nvidia.{module}"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-doc"), "-t", "module", "--json", name],
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg")},
        cwd=PROJECT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Unable to parse" not in result.stderr
    doc = json.loads(result.stdout)[name]
    assert doc["doc"]["description"] and doc["doc"]["short_description"]
    assert name in doc["examples"]
