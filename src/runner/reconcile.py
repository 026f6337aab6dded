"""The reconcile loop: level-triggered, cheap in steady state.

Every cycle runs these phases over one `_Cycle` (the cycle's working memory):

1. due: read the inventory, hash each host's desired state (its variables plus the
   project's playbooks and roles) and pick the hosts that are due (not quarantined,
   not backing off, settings not refused);
2. probe: one task per host that compares the node's managed state with what its
   last successful apply recorded; with the cluster side on, one read of the cluster
   compared with the record of its last apply (label drift makes its host a
   candidate, object drift the cluster);
3. plan (check mode) on the candidates: hosts that drifted, have no record, whose
   desired state changed, that failed last time or whose periodic full check is due
   (each host at its own offset in the interval). Hosts being onboarded and drift
   that cannot disrupt skip the plan; so do hosts already in a rollout, whose change
   was planned when they joined it;
4. apply to the planned hosts with changes, and to hosts whose Node labels the
   cluster side owes; every apply includes the cluster side once;
5. roll: a disruptive change (driver reload, MIG layout, container runtime restart)
   goes through its pool's rollout instead, which starts a batch when the last ends:
   max_parallel hosts at a time, never more than max_unavailable of the pool out of
   service, Kubernetes nodes cordoned and drained first (a drain a
   PodDisruptionBudget refuses waits, cordoned, for the next cycle); a failed host
   halts and stays cordoned, and max_failures halted hosts halt the pool. Between
   batches the next cycle starts after the pool's pause, so drift elsewhere in the
   fleet is repaired while a long rollout goes on. In the long-running loop a batch's
   apply runs in the background: the cycles go on for the rest of the fleet while it
   does (its hosts are left alone), and the first cycle after it ends takes its
   results (validated, uncordoned, done) and starts the pool's next batch.

What was repaired (corrective) is recorded per host and component apart from what
changed because the desired state did (intentional). Time, randomness and sleeping
are injected, so the loop's logic runs on fake time in tests.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from runner.engine import CLUSTER_HOST, STAGES, Engine, HostRun, ProbeResult, RunResult
from runner.rollout import (
    IN_FLIGHT,
    PHASES,
    UNAVAILABLE,
    RolloutPolicy,
    policies,
    pool_of,
    slurm_drain,
)
from runner.state import (
    CLUSTER_SUBJECT,
    ClusterRecord,
    HistoryEntry,
    HostRecord,
    HostStatus,
    RolloutRecord,
    StateStore,
)

log = logging.getLogger("runner")

# A host variable that keeps a host out of disruptive rollouts (it is still probed,
# planned and repaired when a change is not disruptive).
EXCLUDE_VARIABLE = "gpufleet_rollout_exclude"
# Whether a host is a Kubernetes node to cordon and drain around disruptive changes;
# set for any host (group_vars/all, usually), the cluster side is applied and probed.
CLUSTER_VARIABLE = "k8s_manifests_apply"
# The component name of the cluster side in drift, history and outcomes.
CLUSTER_COMPONENT = "cluster"
# Components whose drift is repaired only after a plan: putting them back can reload
# the driver, lay out the GPUs anew or restart a container runtime (and with it the
# node's workloads).
DISRUPTIVE_COMPONENTS = ("driver", "mig", "runtime_config")
# Drift whose repair puts back what the last apply recorded and replaces nothing loaded:
# applied even when the plan fails (the plan may fail on that very drift).
REPAIRABLE_KINDS = ("file", "service")
# Rollout phases of a host whose change is still on its way (halted ones wait for a
# release, which plans them again).
_ROLLING = ("queued", *IN_FLIGHT)


@dataclass
class Settings:
    interval: float = 300.0
    # Each sleep is the interval times a random factor in [1 - jitter, 1 + jitter], so
    # reconcilers started together do not stay in step.
    jitter: float = 0.1
    backoff_base: float = 60.0
    backoff_cap: float = 3600.0
    quarantine_after: int = 5
    # A host's whole playbook is planned once per this interval even if nothing
    # drifted (what the probe cannot see: a package a role installs but does not
    # record), each host at its own offset in it.
    full_check_interval: float = 86400.0
    # The rollout policy of pools whose inventory sets none.
    max_parallel: int = 1
    max_unavailable: int = 1
    check_only: bool = False
    limit: str | None = None
    # Only drift in and changes to these components lead to action (all when empty).
    components: tuple[str, ...] = ()


class Stop:
    """Set by a signal handler: `requested` ends the loop after the current batch,
    `urgent` (a second signal) cancels the running Ansible run too."""

    def __init__(self) -> None:
        self.requested = False
        self.urgent = False

    def request(self) -> None:
        self.urgent = self.requested
        self.requested = True


@dataclass
class HostOutcome:
    host: str
    action: str  # probed | planned | applied | rolled-out | skipped | failed | waiting
    reasons: list[str] = field(default_factory=list)
    corrective: list[str] = field(default_factory=list)
    intentional: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    # The pending change disrupts the node's workloads: it goes through a rollout.
    disruptive: bool = False
    diffs: dict[str, list[str]] = field(default_factory=dict)
    message: str = ""


@dataclass
class CycleReport:
    started: float
    finished: float = 0.0
    outcomes: dict[str, HostOutcome] = field(default_factory=dict)
    probed: int = 0
    planned: int = 0
    applied: int = 0
    interrupted: bool = False
    # The cluster side this cycle, in words ("" when the inventory has none).
    cluster: str = ""
    # The cluster side has drift or owed work this cycle did not apply (check mode).
    cluster_pending: bool = False
    cluster_failed: bool = False
    # Pool -> where its rollout stands after this cycle, in words.
    rollouts: dict[str, str] = field(default_factory=dict)
    # When the next batch of a rollout may start (the loop's next cycle starts then
    # rather than a whole interval later); None when no rollout has one to go.
    next_batch_at: float | None = None

    def hosts_with(self, action: str) -> list[str]:
        return sorted(h for h, o in self.outcomes.items() if o.action == action)


class Observer:
    """What the loop tells those who watch it (metrics, logs). Each method does
    nothing here; an observer overrides the ones it needs."""

    def cycle_finished(self, report: CycleReport) -> None:
        """A cycle ended (or was interrupted)."""

    def hosts_acted(self, phase: str, count: int) -> None:
        """`count` hosts were probed, planned or applied (`phase`)."""

    def host_updated(self, record: HostRecord) -> None:
        """A host's record was stored: its status, stages or rollout phase may differ."""

    def host_forgotten(self, host: str) -> None:
        """A host left the inventory; the state forgot it."""

    def drift_found(self, item: Mapping[str, Any]) -> None:
        """The probe found one difference from a record (a node's or the cluster's)."""

    def component_changed(self, host: str, component: str, kind: str) -> None:
        """An apply changed `component` on `host`: corrective or intentional."""

    def host_quarantined(self, host: str) -> None:
        """A host failed too often in a row and is left alone until released."""


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

    def host_updated(self, record: HostRecord) -> None:
        for observer in self.observers:
            observer.host_updated(record)

    def host_forgotten(self, host: str) -> None:
        for observer in self.observers:
            observer.host_forgotten(host)

    def drift_found(self, item: Mapping[str, Any]) -> None:
        for observer in self.observers:
            observer.drift_found(item)

    def component_changed(self, host: str, component: str, kind: str) -> None:
        for observer in self.observers:
            observer.component_changed(host, component, kind)

    def host_quarantined(self, host: str) -> None:
        for observer in self.observers:
            observer.host_quarantined(host)


class LogObserver(Observer):
    """Log lines for what an operator follows: repairs, changes and quarantines."""

    def component_changed(self, host: str, component: str, kind: str) -> None:
        verb = "repaired" if kind == "corrective" else "changed as desired"
        log.info("%s: %s %s", host, component, verb)

    def host_quarantined(self, host: str) -> None:
        log.warning("%s: quarantined; once fixed: python -m runner release %s", host, host)


@dataclass
class _Cycle:
    """One cycle's working memory, handed from phase to phase."""

    report: CycleReport
    hostvars: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    desired: Mapping[str, str] = field(default_factory=dict)
    records: dict[str, HostRecord] = field(default_factory=dict)
    policies: Mapping[str, RolloutPolicy] = field(default_factory=dict)
    now: float = 0.0
    # The inventory applies the cluster side: every apply includes it.
    cluster: bool = False
    due: list[str] = field(default_factory=list)
    probes: dict[str, ProbeResult] = field(default_factory=dict)
    # Host -> why it is to be planned (or applied straight away).
    candidates: dict[str, list[str]] = field(default_factory=dict)
    # Hosts whose Node labels the cluster side owes (with why), and whether it owes
    # its objects.
    owed: dict[str, list[str]] = field(default_factory=dict)
    cluster_objects: bool = False
    # Hosts whose Node labels drifted this cycle (their repair is corrective).
    cluster_drifted: frozenset[str] = frozenset()
    to_apply: list[str] = field(default_factory=list)
    to_roll: list[str] = field(default_factory=list)


@dataclass
class _Batch:
    """A rollout batch out of service for its change, whose apply is under way."""

    pool: str
    hosts: list[str]
    # Those of its hosts that are Kubernetes nodes (uncordoned after).
    nodes: list[str]
    # The desired state each host's apply reaches (as the cycle that started it saw).
    desired: dict[str, str]
    cluster: bool
    started: float
    result: Future[RunResult]


def backoff_delay(failures: int, settings: Settings, rng: random.Random) -> float:
    """Seconds to wait after `failures` consecutive failures: doubling from the base,
    capped, with the same jitter as the interval."""
    raw = settings.backoff_base * 2 ** max(failures - 1, 0)
    return float(min(raw, settings.backoff_cap) * _jitter(settings, rng))


def _jitter(settings: Settings, rng: random.Random) -> float:
    return 1.0 + rng.uniform(-settings.jitter, settings.jitter)


def full_check_offset(host: str, interval: float) -> float:
    """A host's own place in the full-check interval: stable across restarts (a hash
    of its name), spread evenly over the fleet."""
    digest = hashlib.sha256(host.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * interval


def full_check_due(host: str, last: float | None, now: float, interval: float) -> bool:
    """Whether a host's periodic full check is due: at the host's own offset in each
    interval (so hosts onboarded together do not all fall due together), and never
    sooner than half an interval after the last one (an apply is a full check too).
    Between two checks: from half an interval to one and a half."""
    if last is None or interval <= 0:
        return True
    offset = full_check_offset(host, interval)
    # The host's latest slot: its offset in the interval that `now` is in (or the one
    # before, when now is earlier in the interval than the offset).
    slot = offset + math.floor((now - offset) / interval) * interval
    return slot >= last + interval / 2


class Reconciler:
    def __init__(
        self,
        engine: Engine,
        store: StateStore,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        stop: Stop | None = None,
        observers: Sequence[Observer] = (),
        background: bool = False,
    ) -> None:
        """`background`: a rollout batch's apply runs beside the cycles (the
        long-running loop); otherwise the cycle waits for it (one cycle, tests)."""
        self.engine = engine
        self.store = store
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.stop = stop or Stop()
        self.observe = Observers(observers)
        # host -> the desired state whose settings were found well-formed.
        self._settings_checked: dict[str, str] = {}
        self.background = background
        self._executor: ThreadPoolExecutor | None = None
        # pool -> its batch whose apply is under way.
        self._batches: dict[str, _Batch] = {}

    # -- the loop ----------------------------------------------------------------

    def run(self, once: bool) -> CycleReport:
        """Run cycles until stopped (or one, with `once`); returns the last report.
        A batch whose apply is under way is waited for and finished first."""
        try:
            return self._loop(once)
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _loop(self, once: bool) -> CycleReport:
        while True:
            report = self.cycle()
            if once or self.stop.requested:
                self._finish_batches(report)
                return report
            delay = self.settings.interval * _jitter(self.settings, self.rng)
            if report.next_batch_at is not None:
                delay = min(delay, max(0.0, report.next_batch_at - self.clock()))
                log.info("next cycle (a rollout's next batch) in %.0f s", delay)
            else:
                log.info("next cycle in %.0f s", delay)
            # Sleep in short steps so that a stop request is honoured promptly, and a
            # batch that ends starts the next cycle.
            deadline = self.clock() + delay
            while (
                not self.stop.requested
                and self.clock() < deadline
                and not any(b.result.done() for b in self._batches.values())
            ):
                self.sleep(min(1.0, deadline - self.clock()))
            if self.stop.requested:
                self._finish_batches(report)
                return report

    def cycle(self) -> CycleReport:
        work = _Cycle(CycleReport(started=self.clock()))
        try:
            self._collect(work.report)
            if self._due(work):
                self._probe(work)
                if self._has_work(work):
                    self._plan(work)
                    self._apply(work)
                    self._roll(work)
        finally:
            work.report.finished = self.clock()
            work.report.interrupted = self.stop.requested
            self.observe.cycle_finished(work.report)
        return work.report

    # -- phase 1: which hosts are due --------------------------------------------

    def _due(self, work: _Cycle) -> bool:
        hostvars = self.engine.inventory(self.settings.limit)
        default = RolloutPolicy(self.settings.max_parallel, self.settings.max_unavailable)
        # A wrong rollout variable raises PolicyError here, before any host is touched.
        work.policies = policies(hostvars, default)
        if not self.settings.limit:
            for gone in self.store.forget_missing(list(hostvars)):
                log.info("%s: no longer in the inventory; forgotten", gone)
                self.observe.host_forgotten(gone)
        work.hostvars = hostvars
        work.desired = self.engine.desired_hashes(hostvars)
        work.records = {host: self.store.host(host) for host in hostvars}
        work.cluster = any(_truthy(v.get(CLUSTER_VARIABLE)) for v in hostvars.values())
        work.now = self.clock()
        report = work.report
        applying = self._applying()
        for host, record in work.records.items():
            backing_off = bool(record.next_attempt and record.next_attempt > work.now)
            if host in report.outcomes:
                continue  # its batch ended this cycle: just applied and validated
            if host in applying:
                started = work.now - applying[host].started
                report.outcomes[host] = HostOutcome(
                    host, "skipped", message=f"rollout: its change applying ({started:.0f} s)"
                )
            elif record.quarantined:
                report.outcomes[host] = HostOutcome(host, "skipped", message="quarantined")
            elif backing_off and record.next_attempt:
                wait = record.next_attempt - work.now
                report.outcomes[host] = HostOutcome(
                    host, "skipped", message=f"backing off ({wait:.0f} s left)"
                )
            else:
                work.due.append(host)
                continue
            self.observe.host_updated(record)
        # A host whose last successful apply reached its desired state passed its
        # settings check then (a new reconciler process need not check them again).
        for host in work.due:
            if work.records[host].desired_hash == work.desired[host]:
                self._settings_checked.setdefault(host, work.desired[host])
        refused = self._refused_settings(work.due, work.desired)
        for host, reason in refused.items():
            self._refuse(work.records[host], report, reason)
        work.due = [host for host in work.due if host not in refused]
        return bool(work.due)

    def _refused_settings(self, hosts: list[str], desired: Mapping[str, str]) -> dict[str, str]:
        """Hosts whose inventory settings a stage would refuse, and why.

        Checked on the controller before the probe, and again only when a host's
        desired state changed; a host refused is neither probed nor changed."""
        unchecked = [h for h in hosts if self._settings_checked.get(h) != desired[h]]
        if not unchecked:
            return {}
        refused = self.engine.check_settings(unchecked)
        for host in unchecked:
            if host not in refused:
                self._settings_checked[host] = desired[host]
        return refused

    # -- phase 2: probe ----------------------------------------------------------

    def _probe(self, work: _Cycle) -> None:
        report = work.report
        log.info("probing %d host(s)", len(work.due))
        work.probes = self.engine.probe(work.due, cluster=work.cluster)
        report.probed = len(work.due)
        self.observe.hosts_acted("probe", len(work.due))
        for host in work.due:
            probe, record = work.probes[host], work.records[host]
            record.last_reconcile = self.clock()
            if not probe.reachable:
                self._failed(record, report, "unreachable", probe.reason or "unreachable")
                continue
            drift = self._relevant(probe)
            record.drift = drift
            if drift:
                self._drift_seen(record, drift)
            reasons = self._reasons(record, probe, drift, work.desired[host], work.now)
            if reasons:
                work.candidates[host] = reasons
                self.observe.host_updated(record)
            else:
                report.outcomes[host] = HostOutcome(host, "probed")
                self._save(record, status=_settled_status(record))
        if work.cluster:
            reachable = [h for h in work.due if work.probes[h].reachable]
            work.owed, work.cluster_objects = self._cluster_due(
                work.probes.get(CLUSTER_HOST), reachable, report
            )
            work.cluster_drifted = frozenset(
                h for h, r in work.owed.items() if "cluster drift" in r
            )
        if self.settings.check_only and (work.owed or work.cluster_objects):
            report.cluster_pending = True
            report.cluster += "; would apply the cluster side" + (
                f" (labels of {', '.join(sorted(work.owed))})" if work.owed else ""
            )

    def _has_work(self, work: _Cycle) -> bool:
        if (work.candidates or work.owed or work.cluster_objects) and not self.stop.requested:
            return True
        for host in work.candidates:
            self._save(work.records[host])
        return False

    def _relevant(self, probe: ProbeResult) -> list[dict[str, Any]]:
        wanted = self.settings.components
        return [d for d in probe.drift if not wanted or d["component"] in wanted]

    def _wanted(self, components: Sequence[str]) -> list[str]:
        wanted = self.settings.components
        return [c for c in components if not wanted or c in wanted]

    def _reasons(
        self,
        record: HostRecord,
        probe: ProbeResult,
        drift: Sequence[Mapping[str, Any]],
        desired: str,
        now: float,
    ) -> list[str]:
        reasons = []
        if not probe.recorded:
            reasons.append("no record")
        if drift:
            reasons.append("drift")
        if record.desired_hash != desired:
            if record.desired_hash:
                reasons.append("desired state changed")
            else:  # new to the state; a node with a record was converged before it
                reasons.append("not in the state" if probe.recorded else "first run")
        if record.consecutive_failures or record.status in (
            HostStatus.FAILED,
            HostStatus.REBOOT_REQUIRED,
        ):
            reasons.append("failed last time")
        if record.rollout_phase:
            reasons.append(f"rollout {record.rollout_phase}")
        interval = self.settings.full_check_interval
        if not reasons and full_check_due(record.name, record.last_full_check, now, interval):
            reasons.append("full check due")
        return reasons

    def _drift_seen(self, record: HostRecord, drift: Sequence[Mapping[str, Any]]) -> None:
        events = []
        for item in drift:
            summary = _drift_summary(item)
            events.append(
                HistoryEntry(self.clock(), record.name, "drift", item["component"], summary)
            )
            self.observe.drift_found(item)
        self.store.record(events)

    # -- phase 3: plan -----------------------------------------------------------

    def _plan(self, work: _Cycle) -> None:
        """Sort the candidates into those applied now and those rolled out, planning
        (check mode) the ones whose change could disrupt their node."""
        records, desired, report = work.records, work.desired, work.report
        candidates = dict(work.candidates)
        for host in sorted(candidates):
            record = records[host]
            if record.rollout_phase == "halted" and not self.settings.check_only:
                # Left as it failed, cordoned, until an operator releases it.
                report.outcomes[host] = HostOutcome(
                    host,
                    "skipped",
                    reasons=candidates.pop(host),
                    message=f"rollout halted: {record.rollout_reason}; release it to go on",
                )
                self._save(record)
            elif self._rolling_as_planned(record, desired[host]):
                # In a rollout already, for this very desired state: planned when
                # it joined; the rollout takes it on without planning it again.
                report.outcomes[host] = HostOutcome(host, "planned", reasons=candidates.pop(host))
                work.to_roll.append(host)
            elif not self._plan_needed(record, candidates[host], desired[host]):
                report.outcomes[host] = HostOutcome(host, "planned", reasons=candidates.pop(host))
                work.to_apply.append(host)
        if candidates:
            log.info("planning %d host(s): %s", len(candidates), _reason_text(candidates))
            plan = self.engine.converge(sorted(candidates), check=True)
            report.planned = len(candidates)
            self.observe.hosts_acted("plan", len(candidates))
        for host, reasons in sorted(candidates.items()):
            self._planned(work, records[host], plan.hosts[host], reasons)
        if not self.settings.check_only:
            self._add_owed(work)

    def _planned(self, work: _Cycle, record: HostRecord, run: HostRun, reasons: list[str]) -> None:
        host, desired = record.name, work.desired[record.name]
        outcome = HostOutcome(host, "planned", reasons=reasons)
        outcome.pending = self._wanted(run.changed_components)
        outcome.disruptive = run.disruptive
        outcome.diffs = _diffs(run)
        work.report.outcomes[host] = outcome
        if not run.reachable or run.failures:
            failure = "; ".join(run.failures)
            if run.reachable and self._repairable_without_plan(record, reasons, desired):
                # The plan broke on the drift itself (an apt sources file mangled by
                # hand breaks apt, and with it the plan): putting back what the last
                # apply recorded needs no plan, and is the way out.
                outcome.message = (
                    f"plan failed ({failure}); the drift is only in files and services "
                    "the last apply recorded: repaired without a plan"
                )
                work.to_apply.append(host)
                self._save(record)
                return
            self._failed(record, work.report, "plan", failure + _why_not_repaired(record), outcome)
            return
        record.last_full_check = self.clock()
        needs_apply = bool(outcome.pending) or "drift" in reasons or "no record" in reasons
        if not self.settings.check_only and not needs_apply and record.rollout_phase:
            if record.rollout_phase == "queued":
                # Nothing left to change (put right by other means): out of the rollout,
                # and back in Slurm if gpufleet had drained it (a released halt).
                record.rollout_pool, record.rollout_target = "", None
                left = "left the rollout: nothing to change any more"
                if record.slurm_drained == "gpufleet":
                    name = record.name
                    resumed = self.engine.slurm_action("resume", [name]).hosts[name]
                    left += (
                        "; resumed in Slurm"
                        if resumed.succeeded
                        else (f"; resuming it in Slurm failed: {'; '.join(resumed.failures)}")
                    )
                record.slurm_drained, record.slurm_drain_started = "", None
                self._phase(record, None, left)
            elif record.rollout_phase in _ROLLING:
                # Out of service already: the rollout brings it back (an apply that
                # changes nothing, then the uncordon).
                needs_apply = True
        if self.settings.check_only or not needs_apply:
            if not needs_apply and run.failed_stage is None:
                # Nothing to change: the host already is what is desired.
                _settle(record, desired)
            _take_stages(record, run)
            self._save(
                record, status=HostStatus.DRIFTED if needs_apply else _status_from(run, record)
            )
            return
        if run.disruptive or record.rollout_phase in PHASES:
            record.rollout_target = desired
            work.to_roll.append(host)
        else:
            work.to_apply.append(host)
        self._save(record)

    def _rolling_as_planned(self, record: HostRecord, desired: str) -> bool:
        return (
            not self.settings.check_only
            and record.rollout_phase in _ROLLING
            and record.rollout_target == desired
        )

    def _plan_needed(self, record: HostRecord, reasons: Sequence[str], desired: str) -> bool:
        """Whether a candidate host must be planned before it is applied.

        Not when it is being onboarded (unknown to the state and without a record of
        gpufleet on the node: nothing on it gpufleet could disrupt), nor when its
        desired state is unchanged and all it needs is the repair of drift in
        components whose repair disrupts nothing — putting back a file, a package or
        a service the last apply recorded. Everything else, including drift in the
        driver or a container runtime's configuration, and a node that gpufleet
        converged before but the state does not know (a state database lost or
        rebuilt), is planned first, so that disruptive changes go through a rollout.
        """
        if self.settings.check_only:
            return True
        if record.desired_hash is None:
            return "no record" not in reasons
        drifted = {d["component"] for d in record.drift}
        return not (
            set(reasons) == {"drift"}
            and record.desired_hash == desired
            and record.rollout_phase is None
            and drifted.isdisjoint(DISRUPTIVE_COMPONENTS)
        )

    def _repairable_without_plan(
        self, record: HostRecord, reasons: Sequence[str], desired: str
    ) -> bool:
        """Whether a host whose plan failed may still be applied: its desired state is
        what it reached, and all that drifted are files and services (put back as
        recorded), nothing whose repair could replace a loaded driver or a MIG layout."""
        return (
            not self.settings.check_only
            and set(reasons) == {"drift"}
            and record.desired_hash == desired
            and record.rollout_phase is None
            and bool(record.drift)
            and all(item.get("kind") in REPAIRABLE_KINDS for item in record.drift)
        )

    # -- the cluster side --------------------------------------------------------

    @staticmethod
    def _add_owed(work: _Cycle) -> None:
        """Put the hosts whose Node labels the cluster side owes into this cycle's
        apply, unless something else already takes them or they failed: applying
        them changes nothing on the node (the probe found it as recorded) and
        relabels their Nodes."""
        report = work.report
        for host, reasons in sorted(work.owed.items()):
            known = report.outcomes.get(host)
            if host in work.to_apply or host in work.to_roll:
                continue
            if known is not None and known.action in ("failed", "skipped", "waiting"):
                continue
            if known is not None and known.action == "planned":
                known.reasons.extend(r for r in reasons if r not in known.reasons)
            else:
                report.outcomes[host] = HostOutcome(host, "planned", reasons=reasons)
            work.to_apply.append(host)

    def _cluster_due(
        self, probe: ProbeResult | None, reachable: Sequence[str], report: CycleReport
    ) -> tuple[dict[str, list[str]], bool]:
        """What the cluster side needs this cycle: the hosts whose Node labels are to
        be applied (with why) and whether its objects are. From the cluster probe
        and what an earlier failed apply still owes."""
        state = self.store.cluster()
        owed = {h: ["cluster side owed"] for h in state.owed_hosts if h in reachable}
        objects = state.owed_objects
        if probe is None or not probe.reachable:
            reason = probe.reason if probe else "no result"
            state.status, state.reason = "failed", f"probe failed: {reason}"
            report.cluster, report.cluster_failed = state.reason, True
            self.store.save_cluster(state)
            return {}, False
        if not probe.recorded:
            objects = True
            for host in reachable:
                owed.setdefault(host, []).append("cluster side not recorded")
        events = []
        # The labels of a host whose batch applies are that apply's to change (its
        # cluster side included): not drift while it runs.
        applying = self._applying()
        drift = [
            item
            for item in probe.drift
            if item.get("kind") != "node-labels" or str(item.get("host")) not in applying
        ]
        for item in drift:
            summary = _drift_summary(item)
            labelled = str(item.get("host"))
            if item.get("kind") == "node-labels" and labelled in reachable:
                owed.setdefault(labelled, []).append("cluster drift")
                events.append(
                    HistoryEntry(self.clock(), labelled, "drift", CLUSTER_COMPONENT, summary)
                )
            else:
                objects = True
                events.append(
                    HistoryEntry(self.clock(), CLUSTER_SUBJECT, "drift", CLUSTER_COMPONENT, summary)
                )
            self.observe.drift_found(item)
        state.drift = drift
        if drift:
            state.status = "drifted"
        elif probe.recorded and not owed and not objects:
            state.status, state.reason = "converged", ""
        report.cluster = (
            state.status
            if not drift
            else ("drifted: " + "; ".join(_drift_summary(d) for d in drift))
        )
        self.store.save_cluster(state, events)
        return owed, objects

    def _cluster_applied(
        self,
        run: HostRun | None,
        hosts: Sequence[str],
        report: CycleReport,
        drifted: frozenset[str] = frozenset(),
    ) -> None:
        """Record the cluster side's part of an apply that included it (`drifted`:
        the hosts whose Node labels it repaired)."""
        state = self.store.cluster()
        if run is None or not run.succeeded:
            reason = "; ".join(run.failures) if run else "the cluster side did not run"
            state.status, state.reason = "failed", reason
            state.owed_hosts = sorted(set(state.owed_hosts) | set(hosts))
            state.owed_objects = True
            report.cluster, report.cluster_failed = (
                f"failed: {reason}; owed to the next cycle",
                True,
            )
            event = HistoryEntry(
                self.clock(), CLUSTER_SUBJECT, "failure", CLUSTER_COMPONENT, reason
            )
            self.store.save_cluster(state, [event])
            return
        repaired = bool(state.drift or state.owed_hosts or state.owed_objects)
        events = []
        tasks = sorted({c.task for c in run.changes})
        if tasks:
            kind = "corrective" if repaired else "intentional"
            summary = f"{len(tasks)} task(s) changed: " + "; ".join(tasks)
            events.append(
                HistoryEntry(self.clock(), CLUSTER_SUBJECT, kind, CLUSTER_COMPONENT, summary)
            )
            for host in sorted(drifted & set(hosts)):
                events.append(
                    HistoryEntry(self.clock(), host, "corrective", CLUSTER_COMPONENT, "Node labels")
                )
                outcome = report.outcomes.get(host)
                if outcome is not None and CLUSTER_COMPONENT not in outcome.corrective:
                    outcome.corrective.append(CLUSTER_COMPONENT)
        owed_before = set(state.owed_hosts)
        state = ClusterRecord(
            status="converged",
            owed_hosts=sorted(owed_before - set(hosts)),
            last_apply=self.clock(),
        )
        report.cluster = ("repaired" if repaired and tasks else "applied") + (
            f" ({len(tasks)} task(s) changed)" if tasks else ", no change"
        )
        self.store.save_cluster(state, events)

    # -- phase 4: apply ----------------------------------------------------------

    def _apply(self, work: _Cycle) -> None:
        """Apply to the hosts whose changes disrupt nothing (and the cluster side)."""
        apply_cluster = (
            work.cluster
            and not self.settings.check_only
            and (bool(work.to_apply) or work.cluster_objects)
        )
        if not (work.to_apply or apply_cluster) or self.stop.requested:
            return
        log.info("applying to %d host(s): %s", len(work.to_apply), ", ".join(work.to_apply))
        result = self.engine.converge(work.to_apply, check=False, cluster=work.cluster)
        work.report.applied += len(work.to_apply)
        self.observe.hosts_acted("apply", len(work.to_apply))
        for host in work.to_apply:
            self._applied(work.records[host], result.hosts[host], work.desired[host], work.report)
        if work.cluster:
            self._cluster_applied(result.cluster, work.to_apply, work.report, work.cluster_drifted)

    def _applied(self, record: HostRecord, run: HostRun, desired: str, report: CycleReport) -> None:
        outcome = report.outcomes.setdefault(record.name, HostOutcome(record.name, "applied"))
        outcome.action = "applied"
        record.last_reconcile = self.clock()
        _take_stages(record, run)
        if not run.succeeded:
            failed = run.failed_stage
            reason = "; ".join(run.failures) or (failed[1] if failed else "")
            # A node waiting for a reboot is not broken: it backs off (nothing will
            # change before the reboot) but is never quarantined for it.
            waiting = not run.failures and _status_from(run, record) == HostStatus.REBOOT_REQUIRED
            # A node lost in the middle of the run is unreachable, as a probe finds it.
            stage = "unreachable" if not run.reachable else failed[0] if failed else "apply"
            self._failed(
                record,
                report,
                stage,
                reason,
                outcome,
                status=HostStatus.REBOOT_REQUIRED if waiting else HostStatus.FAILED,
            )
            return
        drifted = {d["component"] for d in record.drift}
        intentional_run = record.desired_hash != desired
        events = []
        for component in run.changed_components:
            corrective = component in drifted or not intentional_run
            kind = "corrective" if corrective else "intentional"
            (outcome.corrective if corrective else outcome.intentional).append(component)
            tasks = sorted({c.task for c in run.changes if c.component == component})
            summary = f"{len(tasks)} task(s) changed: " + "; ".join(tasks)
            events.append(HistoryEntry(self.clock(), record.name, kind, component, summary))
            self.observe.component_changed(record.name, component, kind)
        if run.changes:
            record.last_change = self.clock()
        _settle(record, desired)
        record.last_full_check = self.clock()
        self._save(record, events, status=_status_from(run, record))

    # -- host records ------------------------------------------------------------

    def _save(
        self,
        record: HostRecord,
        events: Sequence[HistoryEntry] = (),
        status: HostStatus | None = None,
    ) -> None:
        """The one place a host's record is stored (and its status set): observers
        hear of every change."""
        if status is not None:
            record.status = status
        self.store.save(record, events)
        self.observe.host_updated(record)

    def _refuse(self, record: HostRecord, report: CycleReport, reason: str) -> None:
        """The inventory is wrong, not the node: no backoff, no quarantine; said once."""
        events = []
        if (record.status, record.reason) != (HostStatus.REFUSED, reason):
            events.append(HistoryEntry(self.clock(), record.name, "failure", "settings", reason))
            log.warning("%s: settings refused, the node is left alone: %s", record.name, reason)
        record.failed_stage, record.reason = "settings", reason
        report.outcomes[record.name] = HostOutcome(
            record.name, "failed", message=f"settings refused, node left alone: {reason}"
        )
        self._save(record, events, status=HostStatus.REFUSED)

    def _failed(
        self,
        record: HostRecord,
        report: CycleReport,
        stage: str,
        reason: str,
        outcome: HostOutcome | None = None,
        status: HostStatus = HostStatus.FAILED,
    ) -> None:
        if stage == "unreachable":
            status = HostStatus.UNREACHABLE
        record.consecutive_failures += 1
        record.last_reconcile = self.clock()
        record.failed_stage = stage
        record.reason = reason
        delay = backoff_delay(record.consecutive_failures, self.settings, self.rng)
        record.next_attempt = self.clock() + delay
        events = [HistoryEntry(self.clock(), record.name, "failure", stage, reason)]
        if (
            record.consecutive_failures >= self.settings.quarantine_after
            and status != HostStatus.REBOOT_REQUIRED
        ):
            record.quarantined = True
            events.append(
                HistoryEntry(
                    self.clock(),
                    record.name,
                    "quarantine",
                    stage,
                    f"after {record.consecutive_failures} consecutive failures, the last: "
                    f"{reason}; once it is fixed: python -m runner release {record.name}",
                )
            )
            self.observe.host_quarantined(record.name)
        outcome = outcome or HostOutcome(record.name, "failed")
        outcome.action = "waiting" if status == HostStatus.REBOOT_REQUIRED else "failed"
        outcome.message = f"{stage}: {reason}; next attempt in {delay:.0f} s" + (
            " (quarantined)" if record.quarantined else ""
        )
        report.outcomes[record.name] = outcome
        self._save(record, events, status=status)

    # -- phase 5: roll disruptive changes out --------------------------------------

    def _roll(self, work: _Cycle) -> None:
        """Move each pool's rollout one batch forward."""
        pools: dict[str, list[str]] = {}
        for host in work.to_roll:
            record = work.records[host]
            if _truthy(work.hostvars[host].get(EXCLUDE_VARIABLE)):
                record.reason = f"disruptive change pending; {EXCLUDE_VARIABLE} is set"
                work.report.outcomes[host].message = record.reason
                self._save(record, status=HostStatus.EXCLUDED)
                continue
            pool = record.rollout_pool or pool_of(work.hostvars[host])
            pools.setdefault(pool, []).append(host)
        for pool, hosts in sorted(pools.items()):
            if self.stop.requested:
                return
            self._advance(pool, hosts, work)

    def _advance(self, pool: str, hosts: Sequence[str], work: _Cycle) -> None:
        records, report = work.records, work.report
        policy = work.policies.get(pool) or RolloutPolicy(
            self.settings.max_parallel, self.settings.max_unavailable
        )
        rollout = self.store.rollouts().get(pool)
        if rollout is None or rollout.finished is not None:
            rollout = RolloutRecord(pool, started=self.clock())
            log.info("rollout of pool %s starts", pool)
        for host in hosts:
            record = records[host]
            if record.rollout_phase is None:
                record.rollout_pool = pool
                self._phase(record, "queued", "disruptive change planned")
            elif record.rollout_pool != pool:  # phases set before pools existed
                record.rollout_pool = pool
                self._save(record)
        members = self._pool_members(pool)
        halted = sorted(h for h, r in members.items() if r.rollout_phase == "halted")
        # Hosts already out of service first (a restarted reconciler resumes them).
        queue = sorted(hosts, key=lambda h: (records[h].rollout_phase == "queued", h))
        busy = [h for h, r in members.items() if r.rollout_phase in UNAVAILABLE and h not in queue]
        size = min(policy.max_parallel, policy.max_unavailable - len(busy))
        wait = (rollout.last_batch or 0.0) + policy.pause - self.clock()
        if pool in self._batches:
            why = f"waits for its batch applying ({', '.join(self._batches[pool].hosts)})"
        elif len(halted) >= policy.max_failures:
            why = f"halted by {', '.join(halted)}; release the host(s) to go on"
            log.warning("rollout of pool %s %s", pool, why)
        elif wait > 0:
            why = f"pauses between batches; the next in {wait:.0f} s"
            report.next_batch_at = _earliest(report.next_batch_at, self.clock() + wait)
        elif size <= 0:
            why = f"waits: {len(busy)} host(s) out of service"
            log.info("rollout of pool %s %s", pool, why)
        else:
            why = ""
        if why:
            for host in queue:
                report.outcomes[host].message = f"rollout {why}"
            report.rollouts[pool] = _rollout_text(rollout, members, why)
            self.store.save_rollout(rollout)
            return
        batch, rest = queue[:size], queue[size:]
        for host in rest:
            report.outcomes[host].message = "rollout: queued for a later batch"
        running = self._start_batch(pool, batch, work)
        if running is not None and self.background:
            self._batches[pool] = running
            report.rollouts[pool] = _rollout_text(rollout, self._pool_members(pool), "")
            self.store.save_rollout(rollout)
            return
        if running is not None:
            self._finish_batch(running, rollout, report)
        self._batch_ended(rollout, report)
        if rest and rollout.finished is None:
            report.next_batch_at = _earliest(report.next_batch_at, self.clock() + policy.pause)

    def _pool_members(self, pool: str) -> dict[str, HostRecord]:
        """The stored records of the hosts in `pool`'s rollout (any phase)."""
        return {h: r for h, r in self.store.hosts().items() if r.rollout_pool == pool}

    def _start_batch(self, pool: str, batch: Sequence[str], work: _Cycle) -> _Batch | None:
        """Take one batch out of service (cordon and drain its Kubernetes nodes), then
        start its apply: in the background, or done when this returns. None when the
        cordon or drain stopped it (a host that fails halts, cordoned)."""
        records, hostvars, report = work.records, work.hostvars, work.report
        log.info("rolling out to %s", ", ".join(batch))
        nodes = [h for h in batch if _truthy(hostvars[h].get(CLUSTER_VARIABLE))]
        for action, before, after in (
            ("cordon", ("queued",), "cordoned"),
            ("drain", ("queued", "cordoned"), "drained"),
        ):
            todo = [h for h in nodes if records[h].rollout_phase in before]
            if not todo:
                continue
            result = self.engine.node_action(action, todo)
            for host in todo:
                run = result.hosts[host]
                failure = "; ".join(run.failures)
                if not run.succeeded and action == "drain" and _blocked_by_budget(failure):
                    self._drain_blocked(records[host], failure, report)
                    return None
                if not run.succeeded:
                    self._halt(records[host], f"{action} failed: {failure}", report)
                    return None
                if action == "cordon" and run.action_changed is False:
                    # Cordoned by someone else before the rollout: it stays so after.
                    records[host].keep_cordoned = True
                self._phase(records[host], after, f"{action}ed")
        if not self._slurm_out_of_service(pool, batch, work):
            return None
        for host in batch:
            self._phase(records[host], "applying", "out of service; its change applying")
        hosts = list(batch)
        applying: Future[RunResult]
        if self.background:
            self._executor = self._executor or ThreadPoolExecutor(thread_name_prefix="batch")
            applying = self._executor.submit(
                self.engine.beside().converge, hosts, False, work.cluster
            )
        else:
            applying = Future()
            applying.set_result(self.engine.converge(hosts, check=False, cluster=work.cluster))
        return _Batch(
            pool,
            hosts,
            nodes,
            {h: work.desired[h] for h in hosts},
            work.cluster,
            self.clock(),
            applying,
        )

    def _slurm_out_of_service(self, pool: str, batch: Sequence[str], work: _Cycle) -> bool:
        """Drain the batch's Slurm nodes (slurm_drain) and wait for their jobs: True
        once none runs a job. A node with jobs holds the batch back, drained, and is
        asked again next cycle; past its slurm_drain_timeout it halts, naming them.
        Every host is taken in (who drained it, since when) before the answer."""
        records, hostvars, report = work.records, work.hostvars, work.report
        asked = [h for h in batch if slurm_drain(h, hostvars[h])[0] != "false"]
        if not asked:
            return True
        result = self.engine.slurm_action(
            "drain", asked, f"rollout of a disruptive change (pool {pool})"
        )
        now = self.clock()
        waiting = halted = False
        for host in asked:
            run, record = result.hosts[host], records[host]
            slurm = run.slurm or {}
            if not run.succeeded or not slurm:
                failure = "; ".join(run.failures) or "no answer from the node"
                self._halt(record, f"Slurm drain failed: {failure}", report)
                halted = True
                continue
            if not slurm.get("managed"):
                continue
            record.slurm_state = str(slurm.get("state") or record.slurm_state)
            # Asked afresh each time: an administrator may have resumed the node since
            # (then this drain is gpufleet's), or drained it before gpufleet did.
            admin = bool(slurm.get("admin_drained"))
            record.slurm_drained = f"admin: {slurm.get('reason_before')}" if admin else "gpufleet"
            if record.slurm_drain_started is None:
                record.slurm_drain_started = now
            jobs = ", ".join(str(j) for j in slurm.get("jobs") or [])
            waited = now - (record.slurm_drain_started or now)
            timeout = slurm_drain(host, hostvars[host])[1]
            if jobs and waited > timeout:
                self._halt(
                    record,
                    f"Slurm job(s) {jobs} still running after {timeout:.0f} s; the node stays "
                    "drained in Slurm",
                    report,
                )
                halted = True
            elif jobs:
                waiting = True
                if record.rollout_phase == "queued":
                    self._phase(record, "cordoned", "drained in Slurm")
                record.rollout_reason = (
                    f"Slurm job(s) {jobs} still running; drained in Slurm {waited:.0f} s ago "
                    f"(waits up to {timeout:.0f} s)"
                )
                self._save(record)
                report.outcomes[host].message = f"rollout waits: {record.rollout_reason}"
            elif record.rollout_phase in ("queued", "cordoned"):
                self._phase(record, "drained", "drained in Slurm; no job left")
            else:
                self._save(record)
        return not (waiting or halted)

    def _collect(self, report: CycleReport, wait: bool = False) -> None:
        """Finish the batches whose apply has ended (with `wait`, all of them, once
        their applies end)."""
        for pool, batch in sorted(self._batches.items()):
            if not (wait or batch.result.done()):
                continue
            del self._batches[pool]
            rollout = self.store.rollouts()[pool]
            self._finish_batch(batch, rollout, report)
            self._batch_ended(rollout, report)

    def _applying(self) -> dict[str, _Batch]:
        """The hosts of the batches under way, each with its batch."""
        return {host: batch for batch in self._batches.values() for host in batch.hosts}

    def _finish_batches(self, report: CycleReport) -> None:
        """Wait for every batch under way and take its results into `report`."""
        if self._batches:
            batches = sorted(self._batches.items())
            log.info(
                "waiting for the batch(es) applying: %s",
                "; ".join(f"pool {pool}: {', '.join(b.hosts)}" for pool, b in batches),
            )
            self._collect(report, wait=True)

    def _finish_batch(self, batch: _Batch, rollout: RolloutRecord, report: CycleReport) -> None:
        """Take a batch's apply in: hosts whose change applied and validated are
        uncordoned and done, the others halt."""
        result = batch.result.result()
        records = {h: self.store.host(h) for h in batch.hosts}
        report.applied += len(batch.hosts)
        self.observe.hosts_acted("apply", len(batch.hosts))
        if batch.cluster:
            self._cluster_applied(result.cluster, batch.hosts, report)
        applied = []
        for host in batch.hosts:
            record = records[host]
            run = result.hosts[host]
            self._applied(record, run, batch.desired[host], report)
            report.outcomes[host].action = "rolled-out"
            if run.succeeded:
                self._phase(record, "applied", "change applied and validated")
                applied.append(host)
            else:
                self._halt(record, record.reason, report)
        resume = [h for h in applied if records[h].slurm_drained == "gpufleet"]
        if resume:
            resumed = self.engine.slurm_action("resume", resume)
            for host in resume:
                state = (resumed.hosts[host].slurm or {}).get("state")
                records[host].slurm_state = str(state or records[host].slurm_state)
                if not resumed.hosts[host].succeeded:
                    failure = "; ".join(resumed.hosts[host].failures)
                    self._halt(records[host], f"Slurm resume failed: {failure}", report)
                    applied.remove(host)
        uncordon = [h for h in applied if h in batch.nodes and not records[h].keep_cordoned]
        if uncordon:
            uncordoned = self.engine.node_action("uncordon", uncordon)
            for host in uncordon:
                if not uncordoned.hosts[host].succeeded:
                    self._halt(records[host], "uncordon failed", report)
                    applied.remove(host)
        for host in applied:
            record = records[host]
            notes = ["left cordoned as it was before"] if record.keep_cordoned else []
            if record.slurm_drained.startswith("admin: "):
                notes.append(
                    "left drained in Slurm as an administrator had it "
                    f"({record.slurm_drained.removeprefix('admin: ')})"
                )
            record.keep_cordoned = False
            record.slurm_drained, record.slurm_drain_started = "", None
            record.rollout_target = None
            record.rollout_pool = ""
            self._phase(record, None, "; ".join(["done", *notes]))
        rollout.done.extend(applied)

    def _batch_ended(self, rollout: RolloutRecord, report: CycleReport) -> None:
        rollout.last_batch = self.clock()
        members = self._pool_members(rollout.pool)
        if not any(r.rollout_phase for r in members.values()):
            rollout.finished = self.clock()
            log.info("rollout of pool %s done: %d host(s)", rollout.pool, len(rollout.done))
        report.rollouts[rollout.pool] = _rollout_text(rollout, members, "")
        self.store.save_rollout(rollout)

    def _phase(self, record: HostRecord, phase: str | None, summary: str) -> None:
        record.rollout_phase = phase
        record.rollout_reason = "" if phase != "halted" else record.rollout_reason
        event = HistoryEntry(self.clock(), record.name, "rollout", phase or "done", summary)
        self._save(record, [event])

    def _drain_blocked(self, record: HostRecord, reason: str, report: CycleReport) -> None:
        """A PodDisruptionBudget refused an eviction: the node stays cordoned, the
        rollout waits (no release needed) and the next cycle drains again."""
        record.rollout_reason = f"drain blocked: {reason}"
        event = HistoryEntry(self.clock(), record.name, "rollout", "drain-blocked", reason)
        self._save(record, [event])
        report.outcomes[
            record.name
        ].message = f"rollout waits, node cordoned; drain blocked: {reason}; retried next cycle"

    def _halt(self, record: HostRecord, reason: str, report: CycleReport) -> None:
        record.rollout_reason = reason
        record.rollout_phase = "halted"
        self._save(record, [HistoryEntry(self.clock(), record.name, "rollout", "halted", reason)])
        report.outcomes[record.name].message = f"rollout halted: {reason}"


def _earliest(current: float | None, candidate: float) -> float:
    return candidate if current is None else min(current, candidate)


def _rollout_text(rollout: RolloutRecord, members: Mapping[str, HostRecord], why: str) -> str:
    """Where a pool's rollout stands, e.g. "2 done, 1 in flight, 3 queued"."""
    phases = [r.rollout_phase for r in members.values()]
    counts = [
        (len(rollout.done), "done"),
        (sum(p in IN_FLIGHT for p in phases), "in flight"),
        (phases.count("queued"), "queued"),
        (phases.count("halted"), "halted"),
    ]
    text = ", ".join(f"{n} {what}" for n, what in counts if n or what == "done")
    if rollout.finished is not None:
        text += "; finished"
    return f"{text}; {why}" if why else text


def release(store: StateStore, host: str, clock: Callable[[], float] = time.time) -> HostRecord:
    """Clear a host's quarantine, backoff and halted rollout (an operator's command)."""
    record = store.host(host)
    record.quarantined = False
    record.consecutive_failures = 0
    record.next_attempt = None
    if record.rollout_phase == "halted":
        # Back to the start: the next cycle plans it again and, if the change is
        # still disruptive, cordons (a no-op when still cordoned) and drains it.
        record.rollout_phase = "queued"
        record.rollout_reason = ""
        record.rollout_target = None
        # The wait for its Slurm jobs starts again (it stays drained meanwhile).
        record.slurm_drain_started = None
    store.save(record, [HistoryEntry(clock(), host, "release", "", "released by operator")])
    return record


def _settle(record: HostRecord, desired: str) -> None:
    """The host reached `desired`: no drift, no failure count, no backoff."""
    record.desired_hash = desired
    record.drift = []
    record.consecutive_failures = 0
    record.next_attempt = None
    record.failed_stage = None
    record.reason = ""


def _take_stages(record: HostRecord, run: HostRun) -> None:
    if run.stages:
        record.stages = {s: str(run.stages[s].get("status")) for s in STAGES if s in run.stages}
        mig = run.stages.get("mig") or {}
        record.mig_layout = str(mig.get("config") or "") if mig.get("status") == "ready" else ""
        record.slurm_state = str((run.stages.get("slurm_gres") or {}).get("slurm_state") or "")


def _status_from(run: HostRun, record: HostRecord) -> HostStatus:
    statuses = [str(o.get("status")) for o in run.stages.values()]
    if "reboot-required" in statuses:
        return HostStatus.REBOOT_REQUIRED
    if statuses and all(s == "not-a-gpu-node" for s in statuses):
        return HostStatus.NOT_A_GPU_NODE
    if run.failed_stage:
        return HostStatus.FAILED
    return HostStatus.CONVERGED if run.stages or record.stages else record.status


def _why_not_repaired(record: HostRecord) -> str:
    """For a failed plan of a drifted host: why no apply was tried without one."""
    others = [
        _drift_summary(item) for item in record.drift if item.get("kind") not in REPAIRABLE_KINDS
    ]
    if not others:
        return ""
    return (
        "; not applied without a plan, since repairing "
        + ", ".join(others)
        + f" may disrupt the node: repair that by hand or run site.yml --limit {record.name}"
    )


def _settled_status(record: HostRecord) -> HostStatus:
    """The status of a host whose probe found nothing to do."""
    if record.stages and all(s == "not-a-gpu-node" for s in record.stages.values()):
        return HostStatus.NOT_A_GPU_NODE
    return HostStatus.CONVERGED


def _diffs(run: HostRun) -> dict[str, list[str]]:
    diffs: dict[str, list[str]] = {}
    for change in run.changes:
        text = f"{change.task}\n{change.diff}".rstrip()
        diffs.setdefault(change.component, []).append(text)
    return diffs


def _reason_text(candidates: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(f"{h} ({', '.join(r)})" for h, r in sorted(candidates.items()))


def _drift_summary(item: Mapping[str, Any]) -> str:
    """One drift item in words: what it is and which of its fields changed, e.g.
    "service dcgm-exporter.service: active_state active -> inactive"."""
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


def _blocked_by_budget(failure: str) -> bool:
    """Whether a drain failed because a PodDisruptionBudget refused an eviction (the
    API server's answer, as kubernetes.core's k8s_drain passes it on)."""
    return "disruption budget" in failure


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "yes", "1")
