# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reconciler's decisions, as pure functions: given records, probe and plan
results, and settings, what happens to a host and why. Nothing here runs Ansible,
reads the clock or touches the state; the phases call these and carry the verdicts
out (through runner.writer for anything stored).

Where a host's status is decided: `host_status`. Where a candidate is sorted before
the plan: `triage`; after it: `after_plan`. Failures and their backoff: `failure`.
A rollout batch's start: `next_batch`. A Slurm drain's answer: `slurm_step`.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from runner.cycle import Action, Settings
from runner.engine import HostRun, ProbeResult
from runner.health import OUT_OF_SERVICE
from runner.rollout import IN_FLIGHT, PHASES, ROLLING, UNAVAILABLE, RolloutPhase, RolloutPolicy
from runner.state import HostRecord, HostStatus, RolloutRecord
from runner.words import drift_summary

# Components whose drift is repaired only after a plan: putting them back can reload
# the driver, lay out the GPUs anew or restart a container runtime (and with it the
# node's workloads).
DISRUPTIVE_COMPONENTS = ("driver", "mig", "runtime_config")
# Drift whose repair puts back what the last apply recorded and replaces nothing loaded:
# applied even when the plan fails (the plan may fail on that very drift).
REPAIRABLE_KINDS = ("file", "service")


# -- time: backoff and the periodic full check ------------------------------------


def jitter(settings: Settings, rng: random.Random) -> float:
    return 1.0 + rng.uniform(-settings.jitter, settings.jitter)


def backoff_delay(failures: int, settings: Settings, rng: random.Random) -> float:
    """Seconds to wait after `failures` consecutive failures: doubling from the base,
    capped, with the same jitter as the interval."""
    raw = settings.backoff_base * 2 ** max(failures - 1, 0)
    return float(min(raw, settings.backoff_cap) * jitter(settings, rng))


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


# -- which hosts are due, and why a due host is a candidate --------------------------


def skip_reason(record: HostRecord, now: float, applying_since: float | None) -> str | None:
    """Why a host is left out of this cycle's probe (None: it is due)."""
    if applying_since is not None:
        return f"rollout: its change applying ({now - applying_since:.0f} s)"
    if record.quarantined:
        return "quarantined"
    if record.next_attempt and record.next_attempt > now:
        return f"backing off ({record.next_attempt - now:.0f} s left)"
    return None


def relevant(drift: Sequence[Mapping[str, Any]], components: Sequence[str]) -> list[Any]:
    """The drift items in `components` (all when none are named)."""
    return [d for d in drift if not components or d["component"] in components]


def wanted(changed: Sequence[str], components: Sequence[str]) -> list[str]:
    return [c for c in changed if not components or c in components]


def reasons(
    record: HostRecord,
    probe: ProbeResult,
    drift: Sequence[Any],
    desired: str,
    now: float,
    full_check_interval: float,
) -> list[str]:
    """Why a probed host is to be planned (or applied); none: it is settled."""
    found = []
    if not probe.recorded:
        found.append("no record")
    if drift:
        found.append("drift")
    if record.desired_hash != desired:
        if record.desired_hash:
            found.append("desired state changed")
        else:  # new to the state; a node with a record was converged before it
            found.append("not in the state" if probe.recorded else "first run")
    if record.consecutive_failures or record.status in (
        HostStatus.FAILED,
        HostStatus.REBOOT_REQUIRED,
    ):
        found.append("failed last time")
    if record.rollout_phase:
        found.append(f"rollout {record.rollout_phase}")
    if record.remedy and not record.quarantined:
        found.append(f"GPU {record.remedy.get('action')} owed")
    if not found and full_check_due(record.name, record.last_full_check, now, full_check_interval):
        found.append("full check due")
    return found


# -- before the plan -------------------------------------------------------------------


class Triage(StrEnum):
    """What happens to a candidate before any plan."""

    HALTED = "halted"  # left as it failed, cordoned, until released
    ROLL_AS_PLANNED = "roll as planned"  # in a rollout for this very desired state
    REMEDY = "remedy"  # its GPUs ask for a reset, a reboot or a replacement
    APPLY = "apply"  # needs no plan (a harmless repair)
    PLAN = "plan"


def triage(record: HostRecord, why: Sequence[str], desired: str, check_only: bool) -> Triage:
    if check_only:
        return Triage.PLAN
    if record.rollout_phase == RolloutPhase.HALTED:
        return Triage.HALTED
    if owes(record):
        return Triage.REMEDY
    if record.rollout_phase in ROLLING and record.rollout_target == desired:
        return Triage.ROLL_AS_PLANNED
    return Triage.PLAN if plan_needed(record, why, desired) else Triage.APPLY


def plan_needed(record: HostRecord, why: Sequence[str], desired: str) -> bool:
    """Whether a candidate host must be planned before it is applied.

    Not when its desired state is unchanged and all it needs is the repair of drift
    in components whose repair disrupts nothing — putting back a file, a package or
    a service the last apply recorded. Everything else is planned first, so that
    disruptive changes go through a rollout: drift in the driver or a container
    runtime's configuration, a node that gpufleet converged before but the state
    does not know (a state database lost or rebuilt), and a node on first contact
    (no record of gpufleet on it, unknown to the state), which may well run jobs on
    GPU software someone else set up.
    """
    if record.desired_hash is None:
        return True
    drifted = {d["component"] for d in record.drift}
    return not (
        set(why) == {"drift"}
        and record.desired_hash == desired
        and record.rollout_phase is None
        and drifted.isdisjoint(DISRUPTIVE_COMPONENTS)
    )


# -- after the plan ---------------------------------------------------------------------


class Next(StrEnum):
    """What happens to a planned host."""

    FAIL = "fail"  # the plan failed
    REPAIR = "repair"  # the plan failed, but the drift is put back without one
    RECORD = "record"  # nothing applied this cycle: its findings are recorded
    ROLL = "roll"  # a disruptive change: through its pool's rollout
    APPLY = "apply"


@dataclass(frozen=True)
class PlanVerdict:
    next: Next
    # Its rollout is over: nothing is left to change (put right by other means).
    leave_rollout: bool = False
    # Something is to change (for RECORD: a check-only cycle leaves it pending).
    needs_apply: bool = False
    # For FAIL: where it failed (the plan itself, or the stage that failed in it) and why.
    stage: str = ""
    reason: str = ""


def after_plan(
    record: HostRecord,
    run: HostRun,
    why: Sequence[str],
    desired: str,
    pending: Sequence[str],
    check_only: bool,
) -> PlanVerdict:
    if not run.reachable or run.failures:
        if run.reachable and repairable_without_plan(record, why, desired, check_only):
            return PlanVerdict(Next.REPAIR)
        failures = "; ".join(run.failures) or "the plan did not reach the host"
        return PlanVerdict(Next.FAIL, stage="plan", reason=failures + why_not_repaired(record))
    # A record out of date (a stage manages files it does not list, after applies that
    # failed or a node taken over) would leave their drift unseen by the probe.
    needs_apply = bool(pending) or "drift" in why or "no record" in why or run.record_changed
    if not needs_apply and run.failed_stage is not None:
        # A stage fails with nothing to change (a refusal: slurmd missing, say): no
        # apply would help; it fails as an apply would, with the stage's own words.
        stage, reason = run.failed_stage
        return PlanVerdict(Next.FAIL, stage=stage, reason=reason)
    leave = False
    if not check_only and not needs_apply and record.rollout_phase:
        if record.rollout_phase == RolloutPhase.QUEUED:
            leave = True
        elif record.rollout_phase in ROLLING:
            # Out of service already: the rollout brings it back (an apply that
            # changes nothing, then the uncordon).
            needs_apply = True
    if check_only or not needs_apply:
        return PlanVerdict(Next.RECORD, leave, needs_apply)
    if run.disruptive or record.rollout_phase in PHASES:
        return PlanVerdict(Next.ROLL, needs_apply=True)
    return PlanVerdict(Next.APPLY, needs_apply=True)


def repairable_without_plan(
    record: HostRecord, why: Sequence[str], desired: str, check_only: bool
) -> bool:
    """Whether a host whose plan failed may still be applied: its desired state is
    what it reached, and all that drifted are files and services (put back as
    recorded), nothing whose repair could replace a loaded driver or a MIG layout."""
    return (
        not check_only
        and set(why) == {"drift"}
        and record.desired_hash == desired
        and record.rollout_phase is None
        and bool(record.drift)
        and all(item.get("kind") in REPAIRABLE_KINDS for item in record.drift)
    )


# -- status and failures ----------------------------------------------------------------


class Situation(StrEnum):
    """Where a cycle left a host, for `host_status`."""

    SETTLED = "settled"  # the probe found nothing to do
    PENDING = "pending"  # a change waits (check-only, or a rollout)
    RAN = "ran"  # a run reached it and passed, or found nothing to change
    FAILED = "failed"  # a run or plan failed
    UNREACHABLE = "unreachable"
    REFUSED = "refused"  # its inventory settings are wrong
    EXCLUDED = "excluded"  # a disruptive change waits; it is kept out of rollouts


def host_status(situation: Situation, record: HostRecord, run: HostRun | None = None) -> HostStatus:
    """The one place a host's status is decided."""
    if situation == Situation.REFUSED:
        return HostStatus.REFUSED
    if situation == Situation.EXCLUDED:
        return HostStatus.EXCLUDED
    if situation == Situation.PENDING:
        return HostStatus.DRIFTED
    if situation == Situation.UNREACHABLE or (
        situation == Situation.FAILED and run is not None and not run.reachable
    ):
        return HostStatus.UNREACHABLE
    if situation == Situation.SETTLED:
        gpu_less = record.stages and all(s == "not-a-gpu-node" for s in record.stages.values())
        return HostStatus.NOT_A_GPU_NODE if gpu_less else HostStatus.CONVERGED
    if situation == Situation.FAILED:
        # A node waiting for a reboot is not broken: it backs off (nothing will
        # change before the reboot) but is never quarantined for it.
        waiting = (
            run is not None
            and not run.failures
            and _ran_status(run, record) == HostStatus.REBOOT_REQUIRED
        )
        return HostStatus.REBOOT_REQUIRED if waiting else HostStatus.FAILED
    return _ran_status(run, record) if run is not None else record.status


def _ran_status(run: HostRun, record: HostRecord) -> HostStatus:
    """The status the stage outcomes of a run that reached the host give it."""
    statuses = [str(o.get("status")) for o in run.stages.values()]
    if "reboot-required" in statuses:
        return HostStatus.REBOOT_REQUIRED
    if statuses and all(s == "not-a-gpu-node" for s in statuses):
        return HostStatus.NOT_A_GPU_NODE
    if run.failed_stage:
        return HostStatus.FAILED
    return HostStatus.CONVERGED if run.stages or record.stages else record.status


@dataclass(frozen=True)
class Failure:
    """A failure's consequences for a host."""

    stage: str
    reason: str
    status: HostStatus
    consecutive: int
    delay: float
    quarantine: bool
    action: Action

    @property
    def message(self) -> str:
        return f"{self.stage}: {self.reason}; next attempt in {self.delay:.0f} s" + (
            " (quarantined)" if self.quarantine else ""
        )


def failure(
    record: HostRecord,
    stage: str,
    reason: str,
    status: HostStatus,
    delay: float,
    quarantine_after: int,
) -> Failure:
    """One more failure of `record` at `stage`: backed off by `delay`, quarantined
    after `quarantine_after` in a row (never for a reboot it waits for)."""
    if stage == "unreachable":
        status = HostStatus.UNREACHABLE
    waiting = status == HostStatus.REBOOT_REQUIRED
    consecutive = record.consecutive_failures + 1
    return Failure(
        stage,
        reason,
        status,
        consecutive,
        delay,
        quarantine=consecutive >= quarantine_after and not waiting,
        action=Action.WAITING if waiting else Action.FAILED,
    )


def why_not_repaired(record: HostRecord) -> str:
    """For a failed plan of a drifted host: why no apply was tried without one."""
    others = [
        drift_summary(item) for item in record.drift if item.get("kind") not in REPAIRABLE_KINDS
    ]
    if not others:
        return ""
    return (
        "; not applied without a plan, since repairing "
        + ", ".join(others)
        + f" may disrupt the node: repair that by hand or run site.yml --limit {record.name}"
    )


# -- rollouts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchPlan:
    """Whether a pool's next batch starts this cycle: `why` not, or which hosts."""

    why: str = ""
    start: tuple[str, ...] = ()
    rest: tuple[str, ...] = ()
    # The pause between batches ends then (the loop wakes for it).
    wake_at: float | None = None


def rollout_queue(hosts: Sequence[str], records: Mapping[str, HostRecord]) -> list[str]:
    """Hosts already out of service first (a restarted reconciler resumes them; they
    count against the budget), then those whose GPUs ask for a remediation."""
    return sorted(
        hosts,
        key=lambda h: (records[h].rollout_phase == RolloutPhase.QUEUED, not owes(records[h]), h),
    )


def owes(record: HostRecord) -> bool:
    """Whether the host's GPUs ask for a remediation (runner.remedy acts on it)."""
    return record.remedy.get("action") in OUT_OF_SERVICE and not record.quarantined


def next_batch(
    queue: Sequence[str],
    members: Mapping[str, HostRecord],
    policy: RolloutPolicy,
    rollout: RolloutRecord,
    now: float,
    applying: Sequence[str] | None,
) -> BatchPlan:
    """A pool's next batch within its policy. `members`: the pool's stored records;
    `applying`: the hosts of its batch still applying, if one is."""
    # A host quarantined for its GPUs stays out (it counts in `busy`), but halts nothing.
    halted = sorted(
        h
        for h, r in members.items()
        if r.rollout_phase == RolloutPhase.HALTED and not r.quarantined
    )
    busy = [h for h, r in members.items() if r.rollout_phase in UNAVAILABLE and h not in queue]
    size = min(policy.max_parallel, policy.max_unavailable - len(busy))
    wait = (rollout.last_batch or 0.0) + policy.pause - now
    if applying is not None:
        return BatchPlan(f"waits for its batch applying ({', '.join(applying)})")
    if len(halted) >= policy.max_failures:
        return BatchPlan(f"halted by {', '.join(halted)}; release the host(s) to go on")
    if wait > 0:
        return BatchPlan(f"pauses between batches; the next in {wait:.0f} s", wake_at=now + wait)
    if size <= 0:
        return BatchPlan(f"waits: {len(busy)} host(s) out of service")
    return BatchPlan(start=tuple(queue[:size]), rest=tuple(queue[size:]))


def rollout_text(rollout: RolloutRecord, members: Mapping[str, HostRecord], why: str) -> str:
    """Where a pool's rollout stands, e.g. "2 done, 1 in flight, 3 queued"."""
    phases = [r.rollout_phase for r in members.values()]
    counts = [
        (len(rollout.done), "done"),
        (sum(p in IN_FLIGHT for p in phases), "in flight"),
        (phases.count(RolloutPhase.QUEUED), "queued"),
        (phases.count(RolloutPhase.HALTED), "halted"),
    ]
    text = ", ".join(f"{n} {what}" for n, what in counts if n or what == "done")
    if rollout.finished is not None:
        text += "; finished"
    return f"{text}; {why}" if why else text


class SlurmNext(StrEnum):
    UNMANAGED = "unmanaged"  # not a Slurm node gpufleet drains
    HALT = "halt"
    WAIT = "wait"  # drained, its jobs still running
    DRAINED = "drained"  # no job left


@dataclass(frozen=True)
class SlurmStep:
    next: SlurmNext
    reason: str = ""


def slurm_step(run: HostRun, waited: float, timeout: float) -> SlurmStep:
    """What a Slurm drain's answer for one host means for its rollout."""
    slurm = run.slurm or {}
    if not run.succeeded or not slurm:
        failure = "; ".join(run.failures) or "no answer from the node"
        return SlurmStep(SlurmNext.HALT, f"Slurm drain failed: {failure}")
    if not slurm.get("managed"):
        return SlurmStep(SlurmNext.UNMANAGED)
    jobs = ", ".join(str(j) for j in slurm.get("jobs") or [])
    if jobs and waited > timeout:
        return SlurmStep(
            SlurmNext.HALT,
            f"Slurm job(s) {jobs} still running after {timeout:.0f} s; the node stays "
            "drained in Slurm",
        )
    if jobs:
        return SlurmStep(
            SlurmNext.WAIT,
            f"Slurm job(s) {jobs} still running; drained in Slurm {waited:.0f} s ago "
            f"(waits up to {timeout:.0f} s)",
        )
    return SlurmStep(SlurmNext.DRAINED)


def blocked_by_budget(failure: str) -> bool:
    """Whether a drain failed because a PodDisruptionBudget refused an eviction (the
    API server's answer, as kubernetes.core's k8s_drain passes it on)."""
    return "disruption budget" in failure


# -- words ---------------------------------------------------------------------------------


def reason_text(candidates: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(f"{h} ({', '.join(r)})" for h, r in sorted(candidates.items()))


def truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "yes", "1")
