"""The GPUs' health as the reconciler keeps it: what to store of a probe's reading,
which Xid events are new, and the history lines for what changed. Decisions only: the
writer stores (runner.writer.Writer.health).

The probe (gpufleet.nvidia.node_state) reads and classifies; docs/health.md has the
table. Taking a node out of service for its health is not done yet (issue 39).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Least to most severe, as the collection's gpu_health.ACTIONS.
ACTIONS = ("none", "watch", "reset", "reboot", "replace")


def severity(action: str) -> int:
    """The action's place in ACTIONS (0 for none or unknown)."""
    return ACTIONS.index(action) if action in ACTIONS else 0


def stored(reading: Mapping[str, Any]) -> dict[str, Any]:
    """What the state keeps of a probe's health: the node's action and, for each GPU
    with a signal, its action and signals' kinds and details; {} where the probe could
    not read the GPUs."""
    gpus = reading.get("gpus")
    if not isinstance(gpus, Mapping):
        return {}
    unwell = {
        address: {
            "action": gpu.get("action", "none"),
            "signals": [
                {"kind": s.get("kind"), "detail": s.get("detail", "")}
                for s in gpu.get("signals") or []
            ],
        }
        for address, gpu in sorted(gpus.items())
        if gpu.get("signals")
    }
    return {"action": str(reading.get("action") or "none"), "gpus": unwell}


def _key(event: Mapping[str, Any], boot: str) -> tuple[str, int, int]:
    return boot, int(event.get("usec") or 0), int(event.get("seq") or 0)


def new_events(
    reading: Mapping[str, Any], seen: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The Xid events of `reading` after the newest one recorded (`seen`), and the
    newest of all to remember. An event is named by the boot's id, its time and its
    sequence number: the kernel numbers records anew at each boot."""
    events = reading.get("xid_events")
    if not isinstance(events, Sequence) or isinstance(events, str):
        return [], dict(seen)
    boot = str(reading.get("boot_id") or "")
    last = (str(seen.get("boot", "")), int(seen.get("usec", -1)), int(seen.get("seq", -1)))
    new = [
        dict(e)
        for e in events
        if isinstance(e, Mapping) and (boot != last[0] or _key(e, boot)[1:] > last[1:])
    ]
    newest = dict(seen)
    if events:
        _, usec, seq = max(_key(e, boot) for e in events if isinstance(e, Mapping))
        if boot != last[0] or (usec, seq) > last[1:]:
            newest = {"boot": boot, "usec": usec, "seq": seq}
    return new, newest


@dataclass(frozen=True)
class Line:
    component: str
    summary: str


def lines(
    before: Mapping[str, Any], after: Mapping[str, Any], events: Sequence[Mapping[str, Any]]
) -> list[Line]:
    """History lines: each new Xid event, and each GPU whose signals changed."""
    out = [
        Line(
            "xid",
            f"Xid {e.get('xid')} on GPU {e.get('pci_address')} asks {e.get('action')} "
            f"({e.get('meaning')}): {e.get('message')}",
        )
        for e in events
    ]
    if not after:
        return out  # not read this time: nothing to compare
    was, now = before.get("gpus") or {}, after.get("gpus") or {}
    for address in sorted(set(was) | set(now)):
        if was.get(address) == now.get(address):
            continue
        gpu = now.get(address)
        if gpu is None:
            out.append(Line("gpu", f"GPU {address}: no signal any more"))
        else:
            said = "; ".join(s["detail"] for s in gpu["signals"])
            out.append(Line("gpu", f"GPU {address} asks {gpu['action']}: {said}"))
    return out
