# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPUs' health as the reconciler keeps it: what to store of a probe's reading,
which Xid events are new, and the history lines for what changed. Decisions only: the
writer stores (runner.writer.Writer.health).

The probe (gpufleet.nvidia.node_state) reads and classifies; docs/health.md has the
table. What a host owes for its GPUs (`Remedy`): `owed` decides from each probe, and
`breaker_open` whether the fleet remediates at all; runner.remedy carries it out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Least to most severe, as the collection's gpu_health.ACTIONS.
ACTIONS = ("none", "watch", "reset", "reboot", "replace")
# The actions that take a node out of service: a reset or a reboot remediates it, a
# replacement quarantines it; the ones below are recorded and counted only.
OUT_OF_SERVICE = ("reset", "reboot", "replace")
REMEDIATED = ("reset", "reboot")
# What the probe says of who a GPU is (as the collection's gpu_health.IDENTITY_FIELDS).
IDENTITY = ("uuid", "serial")


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
            **{k: gpu[k] for k in IDENTITY if gpu.get(k)},
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


# -- what a host owes for its GPUs ---------------------------------------------------


@dataclass(frozen=True)
class Remedy:
    """The remediation a host's GPUs ask for: the worst action asked, each GPU's
    evidence (PCI address -> what asked it, with when it was first read), since when
    it is owed, why it was raised to a replacement, if it was, and the GPUs' identities
    where the probe read them (PCI address -> "uuid GPU-…, serial …")."""

    action: str
    gpus: dict[str, list[str]] = field(default_factory=dict)
    since: float = 0.0
    why: str = ""
    ids: dict[str, str] = field(default_factory=dict)

    def stored(self) -> dict[str, Any]:
        kept = {"action": self.action, "gpus": self.gpus, "since": self.since, "why": self.why}
        return {**kept, "ids": self.ids} if self.ids else kept

    @classmethod
    def of(cls, stored: Mapping[str, Any]) -> Remedy | None:
        if stored.get("action") not in OUT_OF_SERVICE:
            return None
        gpus = {str(a): [str(e) for e in found] for a, found in (stored.get("gpus") or {}).items()}
        since, why = float(stored.get("since") or 0), stored.get("why", "")
        ids = {str(a): str(i) for a, i in (stored.get("ids") or {}).items()}
        return cls(str(stored["action"]), gpus, since, why, ids)

    @property
    def text(self) -> str:
        """One line for operators (and Slurm's drain reason): what, on which GPUs."""
        said = "; ".join(f"GPU {a}: {', '.join(found)}" for a, found in sorted(self.gpus.items()))
        return f"{self.action} asked ({said})" + (f"; {self.why}" if self.why else "")

    @property
    def evidence(self) -> str:
        """`text` with the GPUs' identities, for what is kept of a quarantine (status,
        history): what a vendor asks for when a GPU is sent back."""
        known = "; ".join(f"GPU {a}: {i}" for a, i in sorted(self.ids.items()))
        return f"{self.text} [{known}]" if known else self.text


@dataclass(frozen=True)
class Asking:
    """One signal or Xid event asking to take the node out: on which GPU, what it is."""

    address: str
    evidence: str
    action: str
    identity: str = ""  # "uuid GPU-…, serial …", where the probe read them


def identity(gpu: Mapping[str, Any]) -> str:
    """A GPU's UUID and serial number as the probe read them ("" for neither)."""
    return ", ".join(f"{k} {gpu[k]}" for k in IDENTITY if gpu.get(k))


def asking(reading: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[Asking]:
    """The signals of a probe's reading and its new Xid events that ask a reset or more."""
    found = []
    gpus = reading.get("gpus") or {}
    for address, gpu in sorted(gpus.items()):
        for signal in gpu.get("signals") or []:
            action = str(signal.get("action") or gpu.get("action") or "none")
            if action in OUT_OF_SERVICE:
                evidence = f"{signal.get('kind')}: {signal.get('detail', '')}"
                found.append(Asking(address, evidence, action, identity(gpu)))
    for event in events:
        action = str(event.get("action") or "none")
        if action in OUT_OF_SERVICE:
            address = str(event.get("pci_address"))
            evidence = f"Xid {event.get('xid')} ({event.get('meaning')})"
            found.append(Asking(address, evidence, action, identity(gpus.get(address) or {})))
    return found


def owed(
    before: Remedy | None,
    found: Sequence[Asking],
    now: float,
    remedied_at: float | None,
    window: float,
) -> Remedy | None:
    """What a host owes after a probe found `found`: what it owed before (an Xid is
    read once; a remediation is owed until it is done) with what is asked now added,
    the worst action of all. A GPU asking again within `window` seconds of the host's
    last validated remediation asks for a replacement: the remediation did not hold."""
    if not found:
        return before
    gpus = {a: list(e) for a, e in (before.gpus if before else {}).items()}
    ids = dict(before.ids) if before else {}
    for one in found:
        if one.evidence not in gpus.setdefault(one.address, []):
            gpus[one.address].append(one.evidence)
        if one.identity:
            ids[one.address] = one.identity
    actions = [one.action for one in found] + ([before.action] if before else [])
    action, why = max(actions, key=severity), before.why if before else ""
    if before is None and remedied_at is not None and now - remedied_at < window:
        action = "replace"
        why = f"asked again {now - remedied_at:.0f} s after its last remediation"
    return Remedy(action, gpus, before.since if before else now, why, ids)


def breaker_open(owing: int, threshold: int) -> bool:
    """Whether automatic remediation stops: `owing` hosts of the fleet ask for a reset or
    a reboot at once, at least `threshold` (0: never). Many nodes failing together is
    more likely a bad driver or firmware than bad hardware."""
    return threshold > 0 and owing >= threshold
