# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one writer of the reconciler's state.

Every write to the state database goes through `Writer` (a unit test fails when
another module calls a StateStore write method), and the observers hear of each one
after it was stored, as an immutable `HostUpdated`. A phase decides (runner.decide),
sets what changes on the cycle's in-memory records, and hands them here to store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from runner import health as gpu_health
from runner.decide import Failure
from runner.engine import STAGES, HostRun
from runner.observe import HostUpdated, Observers
from runner.output import program
from runner.rollout import RolloutPhase
from runner.state import (
    CLUSTER_SUBJECT,
    ClusterRecord,
    HistoryEntry,
    HistoryKind,
    HostRecord,
    HostStatus,
    RolloutRecord,
    SlurmDrain,
    StateStore,
)
from runner.words import drift_summary

log = logging.getLogger("runner")


class Writer:
    def __init__(
        self,
        store: StateStore,
        clock: Callable[[], float] = time.time,
        observe: Observers | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.observe = observe or Observers()

    def _entry(self, host: str, kind: HistoryKind, component: str, summary: str) -> HistoryEntry:
        return HistoryEntry(self.clock(), host, kind, component, summary)

    # -- hosts -------------------------------------------------------------------

    def save(
        self,
        record: HostRecord,
        events: Sequence[HistoryEntry] = (),
        status: HostStatus | None = None,
    ) -> None:
        """Store a host's record (with `status`, when given) and tell the observers."""
        if status is not None:
            record.status = status
        self.store.save(record, events)
        self.observe.host_updated(HostUpdated.of(record))

    def seen(self, record: HostRecord) -> None:
        """Tell the observers of a host this cycle left as it stands (nothing stored)."""
        self.observe.host_updated(HostUpdated.of(record))

    def forget_missing(self, names: Sequence[str]) -> list[str]:
        gone = self.store.forget_missing(names)
        for host in gone:
            log.info("%s: no longer in the inventory; forgotten", host)
            self.observe.host_forgotten(host)
        return gone

    def drift(self, host: str, items: Sequence[Mapping[str, Any]], component: str = "") -> None:
        """History entries for drift the probe found (for `host`; `component` overrides
        each item's, as for the cluster side)."""
        events = [
            self._entry(
                host, HistoryKind.DRIFT, component or item["component"], drift_summary(item)
            )
            for item in items
        ]
        self.store.record(events)
        for item in items:
            self.observe.drift_found(item)

    def health(self, record: HostRecord, reading: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A probe's health reading, kept on `record` (stored with it) and told: history
        entries, stored now, for each new Xid event and each GPU whose signals changed.
        Returns the new Xid events."""
        after = gpu_health.stored(reading)
        events, record.xid_seen = gpu_health.new_events(reading, record.xid_seen)
        lines = gpu_health.lines(record.health, after, events)
        if after:
            record.health = after
        self.store.record(
            [self._entry(record.name, HistoryKind.HEALTH, ln.component, ln.summary) for ln in lines]
        )
        for line in lines:
            log.warning("%s: %s", record.name, line.summary)
        for event in events:
            xid, action = int(event.get("xid") or 0), str(event.get("action"))
            self.observe.xid_logged(record.name, str(event.get("pci_address", "")), xid, action)
        return events

    def remedy(self, record: HostRecord, remedy: gpu_health.Remedy | None) -> None:
        """What the host's GPUs ask for now, kept on `record` (stored with it); a
        history entry, stored now, when it is new or grew."""
        stored = remedy.stored() if remedy else {}
        if stored == record.remedy:
            return
        record.remedy = stored
        if remedy is not None:
            summary = f"remediation owed: {remedy.text}"
            self.store.record([self._entry(record.name, HistoryKind.HEALTH, "remedy", summary)])
            log.warning("%s: %s", record.name, summary)

    def remedied(self, record: HostRecord, done: str, reset_failed: str = "") -> str:
        """The host's remediation (`done`: reset, reboot) held: its GPUs ask nothing.
        `reset_failed`: why a reset asked for became a reboot. Returns what it says."""
        record.remedy, record.remedied_at = {}, self.clock()
        how = "a GPU reset" if done == "reset" else f"a {done}"
        if reset_failed:
            how += f" (the GPU reset failed: {reset_failed})"
        summary = f"remediated by {how}; health check passed"
        self.store.record([self._entry(record.name, HistoryKind.HEALTH, "remedy", summary)])
        self.observe.remediated(record.name, done, True)
        return summary

    def quarantine_gpus(self, record: HostRecord, remedy: gpu_health.Remedy) -> None:
        """The host's GPUs are not to be used again until an operator says so: it stays
        out of service (halted in its pool), with the evidence kept in `remedy`."""
        record.remedy, record.quarantined = remedy.stored(), True
        reason = f"GPU quarantined: {remedy.text}"
        record.rollout_phase, record.rollout_reason = RolloutPhase.HALTED, reason
        hint = f"once the GPU is replaced or cleared: {program()} release {record.name}"
        said = f"GPU quarantined: {remedy.evidence}; {hint}"
        event = self._entry(record.name, HistoryKind.QUARANTINE, "gpu", said)
        self.save(record, [event])
        self.observe.host_quarantined(record.name)
        self.observe.remediated(record.name, remedy.action, False)

    def refused(self, record: HostRecord, reason: str, status: HostStatus) -> None:
        """The inventory is wrong, not the node: no backoff, no quarantine; said once."""
        events = []
        if (record.status, record.reason) != (HostStatus.REFUSED, reason):
            events.append(self._entry(record.name, HistoryKind.FAILURE, "settings", reason))
            log.warning("%s: settings refused, the node is left alone: %s", record.name, reason)
        record.failed_stage, record.reason = "settings", reason
        self.save(record, events, status=status)

    def failed(self, record: HostRecord, failure: Failure) -> None:
        now = self.clock()
        record.consecutive_failures = failure.consecutive
        record.last_reconcile = now
        record.failed_stage, record.reason = failure.stage, failure.reason
        record.next_attempt = now + failure.delay
        events = [self._entry(record.name, HistoryKind.FAILURE, failure.stage, failure.reason)]
        if failure.quarantine:
            record.quarantined = True
            events.append(
                self._entry(
                    record.name,
                    HistoryKind.QUARANTINE,
                    failure.stage,
                    f"after {failure.consecutive} consecutive failures, the last: "
                    f"{failure.reason}; once it is fixed: {program()} release {record.name}",
                )
            )
        self.save(record, events, status=failure.status)
        if failure.quarantine:
            self.observe.host_quarantined(record.name)

    def changed(
        self, record: HostRecord, changes: Sequence[tuple[str, str, str]], status: HostStatus
    ) -> None:
        """Store a host an apply reached, with what it changed: (component, corrective
        or intentional, summary) each."""
        events = [
            self._entry(record.name, HistoryKind(kind), component, summary)
            for component, kind, summary in changes
        ]
        self.save(record, events, status=status)
        for component, kind, _summary in changes:
            self.observe.component_changed(record.name, component, kind)

    # -- rollout phases ------------------------------------------------------------

    def phase(self, record: HostRecord, phase: RolloutPhase | None, summary: str) -> None:
        record.rollout_phase = phase
        if phase != RolloutPhase.HALTED:
            record.rollout_reason = ""
        event = self._entry(record.name, HistoryKind.ROLLOUT, phase or "done", summary)
        self.save(record, [event])

    def halt(self, record: HostRecord, reason: str) -> None:
        record.rollout_reason = reason
        record.rollout_phase = RolloutPhase.HALTED
        self.save(record, [self._entry(record.name, HistoryKind.ROLLOUT, "halted", reason)])

    def drain_blocked(self, record: HostRecord, reason: str) -> None:
        record.rollout_reason = f"drain blocked: {reason}"
        self.save(record, [self._entry(record.name, HistoryKind.ROLLOUT, "drain-blocked", reason)])

    def rollout(self, record: RolloutRecord) -> None:
        self.store.save_rollout(record)

    # -- the cluster side ---------------------------------------------------------

    def cluster(
        self,
        record: ClusterRecord,
        events: Sequence[HistoryEntry] = (),
        found: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Store the cluster side's record; `found`: the drift its probe found."""
        self.store.save_cluster(record, events)
        for item in found:
            self.observe.drift_found(item)

    def cluster_entry(self, kind: HistoryKind, summary: str, host: str = "") -> HistoryEntry:
        """A history entry of the cluster side (of `host`'s Node labels, when given)."""
        return self._entry(host or CLUSTER_SUBJECT, kind, "cluster", summary)

    # -- the operator's release -----------------------------------------------------

    def release(self, host: str) -> HostRecord:
        """Clear a host's quarantine, backoff and halted rollout."""
        record = self.store.host(host)
        record.quarantined = False
        # The operator has seen to the GPUs: what they asked is let go, and a GPU asking
        # again is remediated afresh.
        record.remedy, record.remedied_at = {}, None
        record.consecutive_failures = 0
        record.next_attempt = None
        if record.rollout_phase == RolloutPhase.HALTED:
            # Back to the start: the next cycle plans it again and, if the change is
            # still disruptive, cordons (a no-op when still cordoned) and drains it.
            record.rollout_phase = RolloutPhase.QUEUED
            record.rollout_reason = ""
            record.rollout_target = None
            # The wait for its Slurm jobs starts again (it stays drained meanwhile).
            record.slurm_drain_started = None
        self.store.save(
            record, [self._entry(host, HistoryKind.RELEASE, "", "released by operator")]
        )
        return record


def release(store: StateStore, host: str, clock: Callable[[], float] = time.time) -> HostRecord:
    """Clear a host's quarantine, backoff and halted rollout (an operator's command)."""
    return Writer(store, clock).release(host)


# -- what a run or a finished rollout does to a record (in memory) -------------------


def settle(record: HostRecord, desired: str) -> None:
    """The host reached `desired`: no drift, no failure count, no backoff."""
    record.desired_hash = desired
    record.drift = []
    record.consecutive_failures = 0
    record.next_attempt = None
    record.failed_stage = None
    record.reason = ""


def take_stages(record: HostRecord, run: HostRun) -> None:
    """What a run that reached the host found of its stages, MIG layout, Slurm state,
    operating system and driver."""
    if run.stages:
        record.stages = {s: str(run.stages[s].get("status")) for s in STAGES if s in run.stages}
        mig = run.stages.get("mig") or {}
        record.mig_layout = str(mig.get("config") or "") if mig.get("status") == "ready" else ""
        record.slurm_state = str((run.stages.get("slurm_gres") or {}).get("slurm_state") or "")
        driver = run.stages.get("driver") or {}
        record.driver_adopted = str(driver.get("adopted") or "")
        record.os = str(driver.get("os") or "")
        record.driver_version = str(driver.get("version") or "")


def out_of_rollout(record: HostRecord) -> None:
    """The host leaves its pool's rollout: its pool, target and Slurm drain are let go."""
    record.rollout_pool, record.rollout_target = "", None
    record.slurm_drained, record.slurm_drain_started = SlurmDrain.NONE, None
    record.slurm_admin_reason = ""
