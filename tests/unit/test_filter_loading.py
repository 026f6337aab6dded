# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Loading the collection's filter files imports none of their helpers.

Ansible looks up a collection filter by loading the collection's filter files in name
order until one has it, in each worker it forks; a file's helpers are imported when
one of its filters is first called (module_utils.lazy), so a task that uses one filter
does not pay for the others'. Run in a fresh interpreter: this process has imported
the helpers already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

COLLECTIONS = Path(__file__).resolve().parents[2] / "collections"
FILTERS = ("driver", "failures", "k8s", "mig", "packages", "runtime", "slurm", "summary")
PREFIX = "ansible_collections.gpufleet.nvidia.plugins.module_utils."
HELPERS = ("apt_set", "driver_plan", "k8s_objects", "k8s_state", "kernels", "mig_config")
HELPERS += ("mig_profiles", "monitoring", "secureboot")

PROGRAM = f"""
import importlib, json, sys
sys.path.insert(0, {str(COLLECTIONS)!r})
for name in {FILTERS!r}:
    importlib.import_module("ansible_collections.gpufleet.nvidia.plugins.filter." + name)
loaded = lambda: sorted(m[len({PREFIX!r}):] for m in sys.modules if m.startswith({PREFIX!r}))
before = loaded()
driver = sys.modules["ansible_collections.gpufleet.nvidia.plugins.filter.driver"]
prefix = driver.driver_offer_prefix({{"os": {{"id": "ubuntu"}}}})
print(json.dumps({{"before": before, "after": loaded(), "prefix": prefix}}))
"""


def test_filter_files_load_without_their_helpers_and_import_them_when_called():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout)
    assert set(HELPERS).isdisjoint(seen["before"]), seen["before"]
    # The first call of a driver filter imports the driver plan, and answers as before.
    assert "driver_plan" in seen["after"] and "k8s_objects" not in seen["after"]
    assert seen["prefix"] == "nvidia-headless-"  # Canonical's headless driver packages
