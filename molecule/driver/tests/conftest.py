# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's parsers (module_utils) are what the tests read nvidia-smi with."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "collections"))
