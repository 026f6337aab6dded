# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Findings in words, for history lines and reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def drift_summary(item: Mapping[str, Any]) -> str:
    """One drift item in words: what it is and which of its fields changed, e.g.
    "service dcgm-exporter.service: active_state active -> inactive"; an item that says
    why in its own `reason` (kernel drift, which names its kernel) in those words."""
    if item.get("reason"):
        return str(item["reason"])
    recorded, current = item.get("recorded"), item.get("current")
    what = f"{item['kind']} {item['name']}"
    if current is None:
        return f"{what}: gone (was {_brief(recorded)})"
    if recorded is None:
        return f"{what}: appeared ({_brief(current)})"
    if isinstance(recorded, Mapping) and isinstance(current, Mapping):
        changed = [
            f"{key} {_brief(recorded.get(key))} -> {_brief(current.get(key))}"
            for key in sorted(set(recorded) | set(current))
            if recorded.get(key) != current.get(key)
        ]
        return f"{what}: " + ", ".join(changed)
    return f"{what}: {_brief(recorded)} -> {_brief(current)}"


def _brief(value: Any) -> str:
    """A state value short enough for a history line (hashes to 12 characters)."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_brief(v)}" for k, v in sorted(value.items()))
    text = str(value)
    return text[:12] if len(text) == 64 and text.isalnum() else text
