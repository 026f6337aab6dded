# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The driver scenario's helpers (running playbooks, reading their JSON) serve here too."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "driver" / "tests"))
