"""Make the collection, the simulation kit and the fleet tool importable in unit tests."""

from __future__ import annotations

import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
for path in (PROJECT / "collections", PROJECT / "tests" / "sim" / "kit", PROJECT / "tests" / "sim"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

FIXTURES = Path(__file__).parent / "fixtures"
