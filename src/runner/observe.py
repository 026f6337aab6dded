# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the loop tells those who watch it (metrics, logs), as immutable events.

Host updates come from the state writer alone, after each write; the phases tell of
what they ran (`hosts_acted`) and the loop of each finished cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from runner.cycle import CycleReport
from runner.health import REMEDIATED
from runner.output import program
from runner.rollout import RolloutPhase
from runner.state import HostRecord, HostStatus

log = logging.getLogger("runner")


@dataclass(frozen=True)
class HostUpdated:
    """A host's record as it was stored (or, for a host skipped, as it stands)."""

    name: str
    status: HostStatus
    quarantined: bool
    stages: Mapping[str, str]
    rollout_phase: RolloutPhase | None
    # What the GPUs' health asks for (runner.health.ACTIONS); '' where never read.
    health: str = ""
    # A GPU reset or reboot the GPUs asked for, under way: the host queued for it or
    # out of service (not halted, not quarantined).
    remediating: bool = False
    # Each GPU with a health signal: (PCI address, UUID or '', what it asks for).
    gpus: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def of(cls, record: HostRecord) -> HostUpdated:
        return cls(
            record.name,
            record.status,
            record.quarantined,
            MappingProxyType(dict(record.stages)),
            record.rollout_phase,
            str(record.health.get("action", "")),
            record.remedy.get("action") in REMEDIATED
            and not record.quarantined
            and record.rollout_phase not in (None, RolloutPhase.HALTED),
            tuple(
                (address, str(gpu.get("uuid", "")), str(gpu.get("action", "none")))
                for address, gpu in sorted((record.health.get("gpus") or {}).items())
            ),
        )


class Observer:
    """Each method does nothing here; an observer overrides the ones it needs."""

    def cycle_finished(self, report: CycleReport) -> None:
        """A cycle ended (or was interrupted)."""

    def hosts_acted(self, phase: str, count: int) -> None:
        """`count` hosts were probed, planned or applied (`phase`)."""

    def host_updated(self, host: HostUpdated) -> None:
        """A host's record was stored: its status, stages or rollout phase may differ."""

    def host_forgotten(self, host: str) -> None:
        """A host left the inventory; the state forgot it."""

    def drift_found(self, item: Mapping[str, Any]) -> None:
        """The probe found one difference from a record (a node's or the cluster's)."""

    def component_changed(self, host: str, component: str, kind: str) -> None:
        """An apply changed `component` on `host`: corrective or intentional."""

    def host_quarantined(self, host: str) -> None:
        """A host failed too often in a row and is left alone until released."""

    def xid_logged(self, host: str, gpu: str, xid: int, action: str) -> None:
        """The driver logged Xid `xid` for GPU `gpu` (its PCI address) on `host`, asking
        for `action` (counted once)."""

    def remediated(self, host: str, action: str, held: bool) -> None:
        """A GPU remediation (`action`: reset, reboot) ended on `host` and held, or did
        not and the host was quarantined (`action` replace: its GPUs asked for it)."""


class Observers(Observer):
    """Tells every one of `observers`, in order."""

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self.observers = tuple(observers)

    def cycle_finished(self, report: CycleReport) -> None:
        for observer in self.observers:
            observer.cycle_finished(report)

    def hosts_acted(self, phase: str, count: int) -> None:
        for observer in self.observers:
            observer.hosts_acted(phase, count)

    def host_updated(self, host: HostUpdated) -> None:
        for observer in self.observers:
            observer.host_updated(host)

    def host_forgotten(self, host: str) -> None:
        for observer in self.observers:
            observer.host_forgotten(host)

    def drift_found(self, item: Mapping[str, Any]) -> None:
        frozen = MappingProxyType(dict(item))
        for observer in self.observers:
            observer.drift_found(frozen)

    def component_changed(self, host: str, component: str, kind: str) -> None:
        for observer in self.observers:
            observer.component_changed(host, component, kind)

    def host_quarantined(self, host: str) -> None:
        for observer in self.observers:
            observer.host_quarantined(host)

    def xid_logged(self, host: str, gpu: str, xid: int, action: str) -> None:
        for observer in self.observers:
            observer.xid_logged(host, gpu, xid, action)

    def remediated(self, host: str, action: str, held: bool) -> None:
        for observer in self.observers:
            observer.remediated(host, action, held)


class LogObserver(Observer):
    """Log lines for what an operator follows: repairs, changes and quarantines."""

    def component_changed(self, host: str, component: str, kind: str) -> None:
        verb = "repaired" if kind == "corrective" else "changed as desired"
        log.info("%s: %s %s", host, component, verb)

    def host_quarantined(self, host: str) -> None:
        log.warning("%s: quarantined; once fixed: %s release %s", host, program(), host)
