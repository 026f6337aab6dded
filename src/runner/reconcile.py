"""The reconcile loop: level-triggered, cheap in steady state.

Every cycle:
1. read the inventory and hash each host's desired state (its variables plus the
   project's playbooks and roles);
2. probe every host that is due (not quarantined, not backing off): one task that
   compares the node's managed state with what its last successful apply recorded;
   with the cluster side on, one read of the cluster compared with the record of its
   last apply (label drift makes its host a candidate, object drift the cluster);
3. plan (check mode) on the hosts that drifted, have no record, whose desired state
   changed, that failed last time, that are in a rollout, or whose periodic full
   check is due;
4. apply to the planned hosts with changes, and to hosts whose Node labels the
   cluster side owes; every apply includes the cluster side once. A disruptive
   change (driver reload, container runtime restart) goes through a rollout instead:
   max_parallel hosts at a time, never more than max_unavailable out of service,
   Kubernetes nodes cordoned and drained first (a drain a PodDisruptionBudget
   refuses waits, cordoned, for the next cycle); a failure halts the rollout and the
   host stays cordoned;
5. record, per host and component, what was repaired (corrective) apart from what
   changed because the desired state did (intentional).

Time, randomness and sleeping are injected, so the loop's logic runs on fake time in
tests.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.engine import CLUSTER_HOST, STAGES, Engine, HostRun, ProbeResult
from runner.state import CLUSTER_SUBJECT, ClusterRecord, HistoryEntry, HostRecord, StateStore

log = logging.getLogger("runner")

# A host variable that keeps a host out of disruptive rollouts (it is still probed,
# planned and repaired when a change is not disruptive).
EXCLUDE_VARIABLE = "gpufleet_rollout_exclude"
# Whether a host is a Kubernetes node to cordon and drain around disruptive changes;
# set for any host (group_vars/all, usually), the cluster side is applied and probed.
CLUSTER_VARIABLE = "k8s_manifests_apply"
# The component name of the cluster side in drift, history and outcomes.
CLUSTER_COMPONENT = "cluster"
# Rollout phases a host passes through; the ones in UNAVAILABLE are out of service.
UNAVAILABLE = ("cordoned", "drained", "applied", "halted")
# Components whose drift is repaired only after a plan: putting them back can reload
# the driver, lay out the GPUs anew or restart a container runtime (and with it the
# node's workloads).
DISRUPTIVE_COMPONENTS = ("driver", "mig", "runtime_config")
# Drift whose repair puts back what the last apply recorded and replaces nothing loaded:
# applied even when the plan fails (the plan may fail on that very drift).
REPAIRABLE_KINDS = ("file", "service")


@dataclass
class Settings:
    interval: float = 300.0
    # Each sleep is the interval times a random factor in [1 - jitter, 1 + jitter], so
    # reconcilers started together do not stay in step.
    jitter: float = 0.1
    backoff_base: float = 60.0
    backoff_cap: float = 3600.0
    quarantine_after: int = 5
    # A host's whole playbook is planned at least this often even if nothing drifted
    # (what the probe cannot see: a package a role installs but does not record).
    full_check_interval: float = 86400.0
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

    def hosts_with(self, action: str) -> list[str]:
        return sorted(h for h, o in self.outcomes.items() if o.action == action)


@dataclass
class _Cycle:
    """What one cycle knows about its hosts, passed through a rollout."""

    records: Mapping[str, HostRecord]
    hostvars: Mapping[str, Mapping[str, Any]]
    desired: Mapping[str, str]
    report: CycleReport
    # The inventory applies the cluster side: every apply includes it.
    cluster: bool = False
    # Hosts whose Node labels drifted this cycle (their repair is corrective).
    cluster_drifted: frozenset[str] = frozenset()


Hook = Callable[[str, Any], None]


def backoff_delay(failures: int, settings: Settings, rng: random.Random) -> float:
    """Seconds to wait after `failures` consecutive failures: doubling from the base,
    capped, with the same jitter as the interval."""
    raw = settings.backoff_base * 2 ** max(failures - 1, 0)
    return float(min(raw, settings.backoff_cap) * _jitter(settings, rng))


def _jitter(settings: Settings, rng: random.Random) -> float:
    return 1.0 + rng.uniform(-settings.jitter, settings.jitter)


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
        hook: Hook | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.stop = stop or Stop()
        # Observers (metrics) are told about cycles, drift, changes and host states.
        self.hook = hook or (lambda _event, _data: None)
        # host -> the desired state whose settings were found well-formed.
        self._settings_checked: dict[str, str] = {}

    # -- the loop ----------------------------------------------------------------

    def run(self, once: bool) -> CycleReport:
        """Run cycles until stopped (or one, with `once`); returns the last report."""
        while True:
            report = self.cycle()
            if once or self.stop.requested:
                return report
            delay = self.settings.interval * _jitter(self.settings, self.rng)
            log.info("next cycle in %.0f s", delay)
            # Sleep in short steps so that a stop request is honoured promptly.
            deadline = self.clock() + delay
            while not self.stop.requested and self.clock() < deadline:
                self.sleep(min(1.0, deadline - self.clock()))
            if self.stop.requested:
                return report

    def cycle(self) -> CycleReport:
        report = CycleReport(started=self.clock())
        try:
            self._cycle(report)
        finally:
            report.finished = self.clock()
            report.interrupted = self.stop.requested
            self.hook("cycle", report)
        return report

    def _cycle(self, report: CycleReport) -> None:
        hostvars = self.engine.inventory(self.settings.limit)
        if not self.settings.limit:
            for gone in self.store.forget_missing(list(hostvars)):
                log.info("%s: no longer in the inventory; forgotten", gone)
                self.hook("forgotten", gone)
        desired = self.engine.desired_hashes(hostvars)
        records = {host: self.store.host(host) for host in hostvars}
        cluster_on = any(_truthy(v.get(CLUSTER_VARIABLE)) for v in hostvars.values())
        now = self.clock()

        due = []
        for host, record in records.items():
            if record.quarantined or (record.next_attempt and record.next_attempt > now):
                self.hook("host", record)
            if record.quarantined:
                report.outcomes[host] = HostOutcome(host, "skipped", message="quarantined")
            elif record.next_attempt and record.next_attempt > now:
                wait = record.next_attempt - now
                report.outcomes[host] = HostOutcome(
                    host, "skipped", message=f"backing off ({wait:.0f} s left)"
                )
            else:
                due.append(host)
        refused = self._refused_settings(due, desired)
        for host, reason in refused.items():
            self._refuse(records[host], report, reason)
        due = [host for host in due if host not in refused]
        if not due:
            return

        log.info("probing %d host(s)", len(due))
        probes = self.engine.probe(due, cluster=cluster_on)
        report.probed = len(due)
        self.hook("phase", ("probe", len(due)))
        candidates: dict[str, list[str]] = {}
        for host in due:
            probe = probes[host]
            record = records[host]
            record.last_reconcile = self.clock()
            if not probe.reachable:
                self._failed(record, report, "unreachable", probe.reason or "unreachable")
                continue
            drift = self._relevant(probe)
            record.drift = drift
            if drift:
                self._drift_seen(record, drift)
            reasons = self._reasons(record, probe, drift, desired[host], now)
            if reasons:
                candidates[host] = reasons
            else:
                record.status = _settled_status(record)
                self.store.save(record)
                report.outcomes[host] = HostOutcome(host, "probed")
            self.hook("host", record)
        owed: dict[str, list[str]] = {}
        cluster_objects = False
        if cluster_on:
            reachable = [h for h in due if probes[h].reachable]
            owed, cluster_objects = self._cluster_due(probes.get(CLUSTER_HOST), reachable, report)
        cycle = _Cycle(
            records,
            hostvars,
            desired,
            report,
            cluster=cluster_on,
            cluster_drifted=frozenset(h for h, r in owed.items() if "cluster drift" in r),
        )
        if self.settings.check_only and (owed or cluster_objects):
            report.cluster_pending = True
            report.cluster += "; would apply the cluster side" + (
                f" (labels of {', '.join(sorted(owed))})" if owed else ""
            )
        if (not candidates and not owed and not cluster_objects) or self.stop.requested:
            for host in candidates:
                self.store.save(records[host])
            return

        to_apply: list[str] = []
        to_roll: list[str] = []
        # The plan exists to find disruptive changes before they are made; hosts
        # where none can be due are applied straight away (see _plan_needed).
        unplanned = [
            h
            for h in sorted(candidates)
            if not self._plan_needed(records[h], candidates[h], desired[h])
        ]
        for host in unplanned:
            report.outcomes[host] = HostOutcome(host, "planned", reasons=candidates.pop(host))
            to_apply.append(host)
        if candidates:
            log.info("planning %d host(s): %s", len(candidates), _reason_text(candidates))
            plan = self.engine.converge(sorted(candidates), check=True)
            report.planned = len(candidates)
            self.hook("phase", ("plan", len(candidates)))
        for host, reasons in sorted(candidates.items()):
            record, run = records[host], plan.hosts[host]
            outcome = HostOutcome(host, "planned", reasons=reasons)
            outcome.pending = self._wanted(run.changed_components)
            outcome.disruptive = run.disruptive
            outcome.diffs = _diffs(run)
            report.outcomes[host] = outcome
            if not run.reachable or run.failures:
                failure = "; ".join(run.failures)
                if run.reachable and self._repairable_without_plan(record, reasons, desired[host]):
                    # The plan broke on the drift itself (an apt sources file mangled
                    # by hand breaks apt, and with it the plan): putting back what
                    # the last apply recorded needs no plan, and is the way out.
                    outcome.message = (
                        f"plan failed ({failure}); the drift is only in files and services "
                        "the last apply recorded: repaired without a plan"
                    )
                    to_apply.append(host)
                    self.store.save(record)
                    continue
                self._failed(record, report, "plan", failure + _why_not_repaired(record), outcome)
                continue
            record.last_full_check = self.clock()
            needs_apply = bool(outcome.pending) or "drift" in reasons or "no record" in reasons
            if self.settings.check_only or not needs_apply:
                if not needs_apply and run.failed_stage is None:
                    # Nothing to change: the host already is what is desired.
                    _settle(record, desired[host])
                record.status = "drifted" if needs_apply else _status_from(run, record)
                _take_stages(record, run)
                self.store.save(record)
                continue
            if run.disruptive or record.rollout_phase in (*UNAVAILABLE, "queued"):
                to_roll.append(host)
            else:
                to_apply.append(host)
            self.store.save(record)

        if not self.settings.check_only:
            self._add_owed(owed, to_apply, to_roll, report)
        apply_cluster = (
            cluster_on and not self.settings.check_only and (bool(to_apply) or cluster_objects)
        )
        if (to_apply or apply_cluster) and not self.stop.requested:
            log.info("applying to %d host(s): %s", len(to_apply), ", ".join(to_apply))
            result = self.engine.converge(to_apply, check=False, cluster=cluster_on)
            report.applied += len(to_apply)
            self.hook("phase", ("apply", len(to_apply)))
            for host in to_apply:
                self._applied(records[host], result.hosts[host], desired[host], report)
            if cluster_on:
                self._cluster_applied(result.cluster, to_apply, cycle)
        if to_roll:
            self._rollout(to_roll, cycle)

    # -- decisions ---------------------------------------------------------------

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
        if record.consecutive_failures or record.status in ("failed", "reboot-required"):
            reasons.append("failed last time")
        if record.rollout_phase:
            reasons.append(f"rollout {record.rollout_phase}")
        last = record.last_full_check
        overdue = last is None or now - last >= self.settings.full_check_interval
        if overdue and not reasons:
            reasons.append("full check due")
        return reasons

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

    def _drift_seen(self, record: HostRecord, drift: Sequence[Mapping[str, Any]]) -> None:
        events = []
        for item in drift:
            summary = _drift_summary(item)
            events.append(
                HistoryEntry(self.clock(), record.name, "drift", item["component"], summary)
            )
            self.hook("drift", item)
        self.store.record(events)

    # -- the cluster side --------------------------------------------------------

    @staticmethod
    def _add_owed(
        owed: Mapping[str, list[str]],
        to_apply: list[str],
        to_roll: Sequence[str],
        report: CycleReport,
    ) -> None:
        """Put the hosts whose Node labels the cluster side owes into this cycle's
        apply, unless something else already takes them or they failed: applying
        them changes nothing on the node (the probe found it as recorded) and
        relabels their Nodes."""
        for host, reasons in sorted(owed.items()):
            known = report.outcomes.get(host)
            if host in to_apply or host in to_roll:
                continue
            if known is not None and known.action in ("failed", "skipped", "waiting"):
                continue
            if known is not None and known.action == "planned":
                known.reasons.extend(r for r in reasons if r not in known.reasons)
            else:
                report.outcomes[host] = HostOutcome(host, "planned", reasons=reasons)
            to_apply.append(host)

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
        for item in probe.drift:
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
            self.hook("drift", item)
        state.drift = list(probe.drift)
        if probe.drift:
            state.status = "drifted"
        elif probe.recorded and not owed and not objects:
            state.status, state.reason = "converged", ""
        report.cluster = (
            state.status
            if not probe.drift
            else ("drifted: " + "; ".join(_drift_summary(d) for d in probe.drift))
        )
        self.store.save_cluster(state, events)
        return owed, objects

    def _cluster_applied(self, run: HostRun | None, hosts: Sequence[str], cycle: _Cycle) -> None:
        """Record the cluster side's part of an apply that included it."""
        state = self.store.cluster()
        report = cycle.report
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
            for host in sorted(cycle.cluster_drifted & set(hosts)):
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

    # -- applying ----------------------------------------------------------------

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
            waiting = not run.failures and _status_from(run, record) == "reboot-required"
            # A node lost in the middle of the run is unreachable, as a probe finds it.
            stage = "unreachable" if not run.reachable else failed[0] if failed else "apply"
            self._failed(
                record,
                report,
                stage,
                reason,
                outcome,
                status="reboot-required" if waiting else "failed",
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
            self.hook(kind, (record.name, component))
        if run.changes:
            record.last_change = self.clock()
        _settle(record, desired)
        record.status = _status_from(run, record)
        record.last_full_check = self.clock()
        self.store.save(record, events)
        self.hook("host", record)

    def _refused_settings(self, hosts: list[str], desired: dict[str, str]) -> dict[str, str]:
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

    def _refuse(self, record: HostRecord, report: CycleReport, reason: str) -> None:
        """The inventory is wrong, not the node: no backoff, no quarantine; said once."""
        events = []
        if (record.status, record.reason) != ("refused", reason):
            events.append(HistoryEntry(self.clock(), record.name, "failure", "settings", reason))
            log.warning("%s: settings refused, the node is left alone: %s", record.name, reason)
        record.status, record.failed_stage, record.reason = "refused", "settings", reason
        report.outcomes[record.name] = HostOutcome(
            record.name, "failed", message=f"settings refused, node left alone: {reason}"
        )
        self.store.save(record, events)
        self.hook("host", record)

    def _failed(
        self,
        record: HostRecord,
        report: CycleReport,
        stage: str,
        reason: str,
        outcome: HostOutcome | None = None,
        status: str = "failed",
    ) -> None:
        record.consecutive_failures += 1
        record.last_reconcile = self.clock()
        record.status = "unreachable" if stage == "unreachable" else status
        record.failed_stage = stage
        record.reason = reason
        delay = backoff_delay(record.consecutive_failures, self.settings, self.rng)
        record.next_attempt = self.clock() + delay
        events = [HistoryEntry(self.clock(), record.name, "failure", stage, reason)]
        if record.consecutive_failures >= self.settings.quarantine_after and (
            record.status != "reboot-required"
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
            self.hook("quarantine", record.name)
        outcome = outcome or HostOutcome(record.name, "failed")
        outcome.action = "waiting" if record.status == "reboot-required" else "failed"
        outcome.message = f"{stage}: {reason}; next attempt in {delay:.0f} s" + (
            " (quarantined)" if record.quarantined else ""
        )
        report.outcomes[record.name] = outcome
        self.store.save(record, events)
        self.hook("host", record)

    # -- disruptive rollouts -----------------------------------------------------

    def _rollout(self, hosts: Sequence[str], cycle: _Cycle) -> None:
        records, hostvars, report = cycle.records, cycle.hostvars, cycle.report
        queue = []
        for host in hosts:
            record = records[host]
            if _truthy(hostvars[host].get(EXCLUDE_VARIABLE)):
                record.status = "excluded"
                record.reason = f"disruptive change pending; {EXCLUDE_VARIABLE} is set"
                self.store.save(record)
                report.outcomes[host].message = record.reason
                continue
            if record.rollout_phase is None:
                record.rollout_phase = "queued"
                self._phase(record, "queued", "disruptive change planned")
            queue.append(host)
        halted = [h for h, r in self.store.hosts().items() if r.rollout_phase == "halted"]
        if halted:
            log.warning("rollout halted by %s; release the host(s) to go on", ", ".join(halted))
            for host in queue:
                report.outcomes[host].message = f"rollout halted by {', '.join(halted)}"
            return
        # Hosts already out of service (a restarted reconciler resumes them first).
        queue.sort(key=lambda h: (records[h].rollout_phase == "queued", h))
        while queue and not self.stop.requested:
            busy = [
                h
                for h, r in self.store.hosts().items()
                if r.rollout_phase in UNAVAILABLE and h not in queue
            ]
            room = self.settings.max_unavailable - len(busy)
            size = min(self.settings.max_parallel, room)
            if size <= 0:
                log.info("rollout waits: %d host(s) out of service", len(busy))
                return
            batch, queue = queue[:size], queue[size:]
            if not self._roll_batch(batch, cycle):
                return

    def _roll_batch(self, batch: Sequence[str], cycle: _Cycle) -> bool:
        records, hostvars, report = cycle.records, cycle.hostvars, cycle.report
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
                    return False
                if not run.succeeded:
                    self._halt(records[host], f"{action} failed: {failure}", report)
                    return False
                if action == "cordon" and run.action_changed is False:
                    # Cordoned by someone else before the rollout: it stays so after.
                    records[host].keep_cordoned = True
                self._phase(records[host], after, f"{action}ed")
        for host in batch:
            if records[host].rollout_phase == "queued":
                # Not a Kubernetes node: nothing to cordon, but out of service now.
                self._phase(records[host], "cordoned", "out of service for the change")
        result = self.engine.converge(list(batch), check=False, cluster=cycle.cluster)
        report.applied += len(batch)
        self.hook("phase", ("apply", len(batch)))
        if cycle.cluster:
            self._cluster_applied(result.cluster, batch, cycle)
        ok = True
        for host in batch:
            record = records[host]
            run = result.hosts[host]
            self._applied(record, run, cycle.desired[host], report)
            report.outcomes[host].action = "rolled-out"
            if not run.succeeded:
                self._halt(record, record.reason, report)
                ok = False
            else:
                self._phase(record, "applied", "change applied and validated")
        if not ok:
            return False
        uncordon = [h for h in nodes if not records[h].keep_cordoned]
        if uncordon:
            result = self.engine.node_action("uncordon", uncordon)
            for host in uncordon:
                if not result.hosts[host].succeeded:
                    self._halt(records[host], "uncordon failed", report)
                    return False
        for host in batch:
            kept = records[host].keep_cordoned
            records[host].keep_cordoned = False
            self._phase(
                records[host], None, "done; left cordoned as it was before" if kept else "done"
            )
        return True

    def _phase(self, record: HostRecord, phase: str | None, summary: str) -> None:
        record.rollout_phase = phase
        record.rollout_reason = "" if phase != "halted" else record.rollout_reason
        event = HistoryEntry(self.clock(), record.name, "rollout", phase or "done", summary)
        self.store.save(record, [event])
        self.hook("rollout", record)

    def _drain_blocked(self, record: HostRecord, reason: str, report: CycleReport) -> None:
        """A PodDisruptionBudget refused an eviction: the node stays cordoned, the
        rollout waits (no release needed) and the next cycle drains again."""
        record.rollout_reason = f"drain blocked: {reason}"
        self.store.save(
            record, [HistoryEntry(self.clock(), record.name, "rollout", "drain-blocked", reason)]
        )
        report.outcomes[
            record.name
        ].message = f"rollout waits, node cordoned; drain blocked: {reason}; retried next cycle"
        self.hook("rollout", record)

    def _halt(self, record: HostRecord, reason: str, report: CycleReport) -> None:
        record.rollout_reason = reason
        record.rollout_phase = "halted"
        self.store.save(
            record, [HistoryEntry(self.clock(), record.name, "rollout", "halted", reason)]
        )
        report.outcomes[record.name].message = f"rollout halted: {reason}"
        self.hook("rollout", record)


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


def _status_from(run: HostRun, record: HostRecord) -> str:
    statuses = [str(o.get("status")) for o in run.stages.values()]
    if "reboot-required" in statuses:
        return "reboot-required"
    if statuses and all(s == "not-a-gpu-node" for s in statuses):
        return "not-a-gpu-node"
    if run.failed_stage:
        return "failed"
    return "converged" if run.stages or record.stages else record.status


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


def _settled_status(record: HostRecord) -> str:
    """The status of a host whose probe found nothing to do."""
    if record.stages and all(s == "not-a-gpu-node" for s in record.stages.values()):
        return "not-a-gpu-node"
    return "converged"


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
