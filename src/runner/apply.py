# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Phase 4 of a cycle: apply to the hosts whose changes disrupt nothing (and the
cluster side, once), and take in what an apply did to a host — here and at the end
of a rollout batch.

What an apply changed is recorded per host and component as corrective (the
component had drifted, or the desired state had not changed) or intentional (the
desired state changed).
"""

from __future__ import annotations

import logging

from runner import cluster as cluster_side
from runner.cycle import Action, Context, Cycle, HostOutcome
from runner.decide import Situation, host_status
from runner.engine import HostRun
from runner.state import HistoryKind, HostRecord
from runner.sweep import fail
from runner.writer import settle, take_stages

log = logging.getLogger("runner")


def apply(ctx: Context, work: Cycle) -> None:
    """Apply to `work.to_apply` (and the cluster side, when the inventory has one and
    something is owed to it)."""
    check_only = ctx.settings.check_only
    apply_cluster = (
        work.cluster and not check_only and (bool(work.to_apply) or work.cluster_objects)
    )
    if not (work.to_apply or apply_cluster) or ctx.stop.requested:
        return
    log.info("applying to %d host(s): %s", len(work.to_apply), ", ".join(work.to_apply))
    result = ctx.engine.converge(work.to_apply, check=False, cluster=work.cluster)
    work.report.applied += len(work.to_apply)
    ctx.observe.hosts_acted("apply", len(work.to_apply))
    for host in work.to_apply:
        applied(ctx, work, work.records[host], result.hosts[host], work.desired[host])
    if work.cluster:
        cluster_side.applied(ctx, work, result.cluster, work.to_apply, work.cluster_drifted)


def applied(ctx: Context, work: Cycle, record: HostRecord, run: HostRun, desired: str) -> None:
    """Take in an apply's run on one host: what it changed, or how it failed."""
    outcome = work.report.outcomes.setdefault(record.name, HostOutcome(record.name, Action.APPLIED))
    outcome.action = Action.APPLIED
    record.last_reconcile = ctx.clock()
    take_stages(record, run)
    if not run.succeeded:
        failed = run.failed_stage if run.reachable else None
        # The failed stage's own words first (the tasks that fail the host after it
        # only repeat them); a node lost in the middle of the run is unreachable, as a
        # probe finds it.
        reason = failed[1] if failed else "; ".join(run.failures) or "the apply failed"
        stage = "unreachable" if not run.reachable else failed[0] if failed else "apply"
        status = host_status(Situation.FAILED, record, run)
        fail(ctx, work, record, stage, reason, status, outcome)
        return
    drifted = {d["component"] for d in record.drift}
    intentional_run = record.desired_hash != desired
    changes = []
    for component in run.changed_components:
        corrective = component in drifted or not intentional_run
        (outcome.corrective if corrective else outcome.intentional).append(component)
        tasks = sorted({c.task for c in run.changes if c.component == component})
        kind = HistoryKind.CORRECTIVE if corrective else HistoryKind.INTENTIONAL
        changes.append((component, kind, f"{len(tasks)} task(s) changed: " + "; ".join(tasks)))
    if run.changes:
        record.last_change = ctx.clock()
    settle(record, desired)
    record.last_full_check = ctx.clock()
    ctx.writer.changed(record, changes, host_status(Situation.RAN, record, run))
