# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Make the simulation's tools (tests/sim: the fleet and the test control plane) importable."""

from __future__ import annotations

import sys
from pathlib import Path

SIM = Path(__file__).resolve().parents[1] / "sim"
if str(SIM) not in sys.path:
    sys.path.insert(0, str(SIM))
