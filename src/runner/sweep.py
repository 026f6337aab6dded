# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Phases 1 to 3 of a cycle: which hosts are due, the probe, and the plan.

`due` reads the inventory and picks the hosts to probe; `probe` finds the candidates
(drift, no record, a changed desired state, a failure, a full check due); `plan`
sorts them into those applied now (`Cycle.to_apply`) and those rolled out
(`Cycle.to_roll`), planning in check mode the ones whose change could disrupt their
node. The decisions are runner.decide's; the writes runner.writer's.
"""

from __future__ import annotations

import logging

from runner import cluster as cluster_side
from runner import decide, remedy
from runner.cycle import Action, Context, Cycle, HostOutcome
from runner.decide import Next, Situation, Triage, host_status
from runner.engine import CLUSTER_HOST, HostRun
from runner.rollout import policies
from runner.state import HostRecord, HostStatus, SlurmDrain
from runner.writer import out_of_rollout, settle, take_stages

log = logging.getLogger("runner")

# Whether a host is a Kubernetes node to cordon and drain around disruptive changes;
# set for any host (group_vars/all, usually), the cluster side is applied and probed.
CLUSTER_VARIABLE = "k8s_manifests_apply"


# -- phase 1: which hosts are due --------------------------------------------------


def due(ctx: Context, work: Cycle) -> bool:
    """Read the inventory and pick the hosts to probe; True when there are any."""
    hostvars = ctx.engine.inventory(ctx.settings.limit)
    # A wrong rollout variable raises PolicyError here, before any host is touched.
    work.policies = policies(hostvars, ctx.settings.default_policy)
    if not ctx.settings.limit:
        # Only hosts gone from the inventory: a host outside --hosts keeps its record
        # (a rollout it is in, a quarantine), should another pattern have been named.
        ctx.writer.forget_missing(list(ctx.engine.inventory_hosts()))
    work.hostvars = hostvars
    work.desired = ctx.engine.desired_hashes(hostvars)
    work.records = {host: ctx.writer.store.host(host) for host in hostvars}
    work.cluster = any(decide.truthy(v.get(CLUSTER_VARIABLE)) for v in hostvars.values())
    work.now = ctx.clock()
    applying = ctx.applying()
    for host, record in work.records.items():
        if host in work.report.outcomes:
            continue  # its batch ended this cycle: just applied and validated
        batch = applying.get(host)
        why = decide.skip_reason(record, work.now, batch.started if batch else None)
        if why is None:
            work.due.append(host)
        else:
            work.outcome(host, Action.SKIPPED, message=why)
            ctx.writer.seen(record)
    refused = _refused_settings(ctx, work)
    for host, reason in refused.items():
        record = work.records[host]
        work.outcome(host, Action.FAILED, message=f"settings refused, node left alone: {reason}")
        ctx.writer.refused(record, reason, host_status(Situation.REFUSED, record))
    work.due = [host for host in work.due if host not in refused]
    return bool(work.due)


def _refused_settings(ctx: Context, work: Cycle) -> dict[str, str]:
    """Hosts whose inventory settings a stage would refuse, and why.

    Checked on the controller before the probe, and again only when a host's
    desired state changed; a host refused is neither probed nor changed."""
    checked = ctx.settings_checked
    for host in work.due:
        # A host whose last successful apply reached its desired state passed its
        # settings check then (a new reconciler process need not check them again).
        if work.records[host].desired_hash == work.desired[host]:
            checked.setdefault(host, work.desired[host])
    unchecked = [h for h in work.due if checked.get(h) != work.desired[h]]
    if not unchecked:
        return {}
    refused = ctx.engine.check_settings(unchecked)
    for host in unchecked:
        if host not in refused:
            checked[host] = work.desired[host]
    return refused


# -- phase 2: probe ----------------------------------------------------------------


def probe(ctx: Context, work: Cycle) -> None:
    """Probe the due hosts (and the cluster side) and find the candidates."""
    log.info("probing %d host(s)", len(work.due))
    work.probes = ctx.engine.probe(work.due, cluster=work.cluster)
    work.report.probed = len(work.due)
    ctx.observe.hosts_acted("probe", len(work.due))
    for host in work.due:
        _probed(ctx, work, work.records[host])
    if work.cluster:
        reachable = [h for h in work.due if work.probes[h].reachable]
        cluster_side.due(ctx, work, work.probes.get(CLUSTER_HOST), reachable)
    if ctx.settings.check_only and (work.owed or work.cluster_objects):
        work.report.cluster_pending = True
        work.report.cluster += "; would apply the cluster side" + (
            f" (labels of {', '.join(sorted(work.owed))})" if work.owed else ""
        )


def _probed(ctx: Context, work: Cycle, record: HostRecord) -> None:
    host, result = record.name, work.probes[record.name]
    record.last_reconcile = ctx.clock()
    if not result.reachable:
        fail(ctx, work, record, "unreachable", result.reason or "unreachable")
        return
    if result.health is not None:
        events = ctx.writer.health(record, result.health)
        if result.recorded and not record.desired_hash:
            # New to this state but converged by gpufleet before (the state directory
            # was lost, or is new): the Xid events already in its log were read by the
            # reconciler that made the record. They are recorded, not acted on again;
            # what the GPUs' readings ask now is.
            events = []
        remedy.found(ctx, record, result.health, events)
    drift = decide.relevant(result.drift, ctx.settings.components)
    record.drift = drift
    if drift:
        ctx.writer.drift(host, drift)
    why = decide.reasons(
        record, result, drift, work.desired[host], work.now, ctx.settings.full_check_interval
    )
    if why:
        work.candidates[host] = why
        ctx.writer.seen(record)
    else:
        work.outcome(host, Action.PROBED)
        ctx.writer.save(record, status=host_status(Situation.SETTLED, record))


def has_work(ctx: Context, work: Cycle) -> bool:
    """Whether the cycle goes on to plan and apply (it does not once a stop is asked
    for: the candidates' probe findings are stored as they are)."""
    if (work.candidates or work.owed or work.cluster_objects) and not ctx.stop.requested:
        return True
    for host in work.candidates:
        ctx.writer.save(work.records[host])
    return False


def fail(
    ctx: Context,
    work: Cycle,
    record: HostRecord,
    stage: str,
    reason: str,
    status: HostStatus = HostStatus.FAILED,
    outcome: HostOutcome | None = None,
) -> None:
    """One more failure of a host: backed off, quarantined after too many. Its
    `outcome` this cycle (a new one when None) says so."""
    delay = decide.backoff_delay(record.consecutive_failures + 1, ctx.settings, ctx.rng)
    failure = decide.failure(record, stage, reason, status, delay, ctx.settings.quarantine_after)
    outcome = outcome or work.outcome(record.name, Action.FAILED)
    outcome.action, outcome.message = failure.action, failure.message
    work.report.outcomes[record.name] = outcome
    ctx.writer.failed(record, failure)


# -- phase 3: plan -------------------------------------------------------------------


def plan(ctx: Context, work: Cycle) -> None:
    """Sort the candidates into those applied now and those rolled out, planning
    (check mode) the ones whose change could disrupt their node."""
    candidates = dict(work.candidates)
    for host in sorted(candidates):
        record = work.records[host]
        verdict = decide.triage(
            record, candidates[host], work.desired[host], ctx.settings.check_only
        )
        if verdict == Triage.PLAN:
            continue
        why = candidates.pop(host)
        if verdict == Triage.REMEDY:
            work.outcome(host, Action.PLANNED, reasons=why, message=remedy.said(record))
            work.to_roll.append(host)
        elif verdict == Triage.HALTED:
            message = f"rollout halted: {record.rollout_reason}; release it to go on"
            work.outcome(host, Action.SKIPPED, reasons=why, message=message)
            ctx.writer.save(record)
        else:
            work.outcome(host, Action.PLANNED, reasons=why)
            (work.to_roll if verdict == Triage.ROLL_AS_PLANNED else work.to_apply).append(host)
    if candidates:
        log.info("planning %d host(s): %s", len(candidates), decide.reason_text(candidates))
        result = ctx.engine.converge(sorted(candidates), check=True)
        work.report.planned = len(candidates)
        ctx.observe.hosts_acted("plan", len(candidates))
        for host, why in sorted(candidates.items()):
            _planned(ctx, work, work.records[host], result.hosts[host], why)
    if not ctx.settings.check_only:
        cluster_side.add_owed(work)


def _planned(ctx: Context, work: Cycle, record: HostRecord, run: HostRun, why: list[str]) -> None:
    host, desired = record.name, work.desired[record.name]
    pending = decide.wanted(run.changed_components, ctx.settings.components)
    outcome = work.outcome(host, Action.PLANNED, reasons=why, pending=pending)
    outcome.disruptive, outcome.diffs = run.disruptive, _diffs(run)
    # A driver the node keeps because the settings leave it unnamed, where the
    # defaults would install another: said in the plan.
    outcome.message = str((run.stages.get("driver") or {}).get("adopted") or "")
    check_only = ctx.settings.check_only
    verdict = decide.after_plan(record, run, why, desired, pending, check_only)
    if verdict.next == Next.REPAIR:
        # The plan broke on the drift itself (an apt sources file mangled by hand
        # breaks apt, and with it the plan): putting back what the last apply
        # recorded needs no plan, and is the way out.
        outcome.message = (
            f"plan failed ({'; '.join(run.failures)}); the drift is only in files and "
            "services the last apply recorded: repaired without a plan"
        )
        work.to_apply.append(host)
        ctx.writer.save(record)
        return
    if verdict.next == Next.FAIL:
        fail(ctx, work, record, verdict.stage, verdict.reason, outcome=outcome)
        return
    record.last_full_check = ctx.clock()
    if verdict.leave_rollout:
        _leave_rollout(ctx, work, record)
    if verdict.next == Next.RECORD:
        if not verdict.needs_apply:
            settle(record, desired)  # nothing to change: it already is what is desired
        take_stages(record, run)
        situation = Situation.PENDING if verdict.needs_apply else Situation.RAN
        ctx.writer.save(record, status=host_status(situation, record, run))
        return
    if verdict.next == Next.ROLL:
        record.rollout_target = desired
        work.to_roll.append(host)
    else:
        work.to_apply.append(host)
    ctx.writer.save(record)


def _leave_rollout(ctx: Context, work: Cycle, record: HostRecord) -> None:
    """Nothing left to change (put right by other means, or a quarantine released once
    its GPU was seen to): out of the rollout, and back in Slurm and uncordoned where
    gpufleet had taken it out."""
    left = ["left the rollout: nothing to change any more"]
    if record.slurm_drained == SlurmDrain.GPUFLEET:
        resumed = ctx.engine.slurm_action("resume", [record.name]).hosts[record.name]
        left.append(
            "resumed in Slurm"
            if resumed.succeeded
            else f"resuming it in Slurm failed: {'; '.join(resumed.failures)}"
        )
    # (a node cordoned before its rollout began is left so; uncordoning one that is not
    # cordoned changes nothing; the GPU health label goes either way)
    if decide.truthy(work.hostvars[record.name].get(CLUSTER_VARIABLE)):
        action = "cordon" if record.keep_cordoned else "uncordon"
        node = ctx.engine.node_action(action, [record.name], {record.name: None})
        if not node.hosts[record.name].succeeded:
            left.append(f"{'uncordoning' if action == 'uncordon' else 'unlabelling'} it failed")
        elif action == "uncordon":
            left.append("uncordoned")
    record.keep_cordoned = False
    out_of_rollout(record)
    ctx.writer.phase(record, None, "; ".join(left))


def _diffs(run: HostRun) -> dict[str, list[str]]:
    diffs: dict[str, list[str]] = {}
    for change in run.changes:
        text = f"{change.task}\n{change.diff}".rstrip()
        diffs.setdefault(change.component, []).append(text)
    return diffs
