# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Phase 5 of a cycle: disruptive changes roll through their pools, a batch at a time,
across cycles.

`roll` queues the cycle's disruptive hosts in their pools and moves each pool one
batch forward; `advance` decides (runner.decide.next_batch) whether a batch starts
now; `start_batch` takes it out of service (runner.out_of_service) and starts its
apply, in the background in the long-running loop; `collect`, at the start of a
later cycle (or at once, in a single cycle), takes its results in: validated hosts
come back into service and are done, the others halt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from runner import cluster as cluster_side
from runner import decide, out_of_service, remedy
from runner.apply import applied as take_applied
from runner.cycle import Action, Batch, Context, Cycle, CycleReport
from runner.decide import Situation, host_status
from runner.engine import RunResult
from runner.rollout import RolloutPhase, pool_of
from runner.state import HostRecord, RolloutRecord, SlurmDrain
from runner.sweep import CLUSTER_VARIABLE
from runner.writer import out_of_rollout

log = logging.getLogger("runner")

# A host variable that keeps a host out of disruptive rollouts (it is still probed,
# planned and repaired when a change is not disruptive).
EXCLUDE_VARIABLE = "gpufleet_rollout_exclude"


def roll(ctx: Context, work: Cycle) -> None:
    """Move each pool's rollout one batch forward (none starts a GPU remediation while
    the circuit breaker holds them)."""
    remedy.hold(ctx, work)
    pools: dict[str, list[str]] = {}
    for host in work.to_roll:
        record = work.records[host]
        if decide.truthy(work.hostvars[host].get(EXCLUDE_VARIABLE)):
            record.reason = f"disruptive change pending; {EXCLUDE_VARIABLE} is set"
            work.report.say(host, record.reason)
            ctx.writer.save(record, status=host_status(Situation.EXCLUDED, record))
            continue
        pool = record.rollout_pool or pool_of(work.hostvars[host])
        pools.setdefault(pool, []).append(host)
    for pool, hosts in sorted(pools.items()):
        if ctx.stop.requested:
            return
        advance(ctx, work, pool, hosts)


def members(ctx: Context, pool: str) -> dict[str, HostRecord]:
    """The stored records of the hosts in `pool`'s rollout (any phase)."""
    return {h: r for h, r in ctx.writer.store.hosts().items() if r.rollout_pool == pool}


def _join(ctx: Context, work: Cycle, pool: str, hosts: Sequence[str]) -> None:
    """Queue the hosts new to the pool's rollout."""
    for host in hosts:
        record = work.records[host]
        if record.rollout_phase is None:
            record.rollout_pool = pool
            why = remedy.said(record) or "disruptive change planned"
            ctx.writer.phase(record, RolloutPhase.QUEUED, why)
        elif record.rollout_pool != pool:  # phases set before pools existed
            record.rollout_pool = pool
            ctx.writer.save(record)


def advance(ctx: Context, work: Cycle, pool: str, hosts: Sequence[str]) -> None:
    """Start the pool's next batch if its policy lets it, else say why it waits."""
    report = work.report
    policy = work.policies.get(pool) or ctx.settings.default_policy
    rollout = ctx.writer.store.rollouts().get(pool)
    if rollout is None or rollout.finished is not None:
        rollout = RolloutRecord(pool, started=ctx.clock())
        log.info("rollout of pool %s starts", pool)
    _join(ctx, work, pool, hosts)
    in_pool = members(ctx, pool)
    queue = decide.rollout_queue(hosts, work.records)
    running = ctx.batches.get(pool)
    plan = decide.next_batch(
        queue, in_pool, policy, rollout, ctx.clock(), running.hosts if running else None
    )
    if plan.why:
        log.info("rollout of pool %s %s", pool, plan.why)
        if plan.wake_at is not None:
            report.batch_due(plan.wake_at)
        for host in queue:
            report.say(host, f"rollout {plan.why}")
        report.rollouts[pool] = decide.rollout_text(rollout, in_pool, plan.why)
        ctx.writer.rollout(rollout)
        return
    for host in plan.rest:
        report.say(host, "rollout: queued for a later batch")
    batch = start_batch(ctx, work, pool, plan.start)
    if batch is not None and ctx.background:
        ctx.batches[pool] = batch
        report.rollouts[pool] = decide.rollout_text(rollout, members(ctx, pool), "")
        ctx.writer.rollout(rollout)
        return
    if batch is not None:
        _finish_batch(ctx, work, batch, rollout)
    _batch_ended(ctx, work.report, rollout)
    if plan.rest and rollout.finished is None:
        report.batch_due(ctx.clock() + policy.pause)


def start_batch(ctx: Context, work: Cycle, pool: str, batch: Sequence[str]) -> Batch | None:
    """Take one batch out of service (cordon and drain its Kubernetes nodes, drain
    its Slurm nodes), then start its apply: in the background, or done when this
    returns. None when taking it out of service stopped it."""
    log.info("rolling out to %s", ", ".join(batch))
    nodes = [h for h in batch if decide.truthy(work.hostvars[h].get(CLUSTER_VARIABLE))]
    if not out_of_service.kubernetes(ctx, work, nodes):
        return None
    reason = (
        remedy.slurm_reason(work.records, batch) or f"rollout of a disruptive change (pool {pool})"
    )
    if not out_of_service.slurm(ctx, work, batch, reason):
        return None
    hosts = remedy.quarantine_asked(ctx, work, batch)
    if not hosts:
        return None
    remedies = remedy.asked(work.records, hosts)
    for host in hosts:
        what = f"its GPUs' {remedies[host]['action']}, then " if host in remedies else "its "
        ctx.writer.phase(
            work.records[host], RolloutPhase.APPLYING, f"out of service; {what}change applying"
        )
    applying: Future[RunResult]
    if ctx.background:
        ctx.executor = ctx.executor or ThreadPoolExecutor(thread_name_prefix="batch")
        engine = ctx.engine.beside()
        applying = ctx.executor.submit(remedy.apply, engine, hosts, remedies, work.cluster)
    else:
        applying = Future()
        applying.set_result(remedy.apply(ctx.engine, hosts, remedies, work.cluster))
    desired = {h: work.desired[h] for h in hosts}
    return Batch(pool, hosts, nodes, desired, work.cluster, ctx.clock(), applying, remedies)


def collect(ctx: Context, work: Cycle, wait: bool = False) -> None:
    """Finish the batches whose apply has ended (with `wait`, all of them, once
    their applies end)."""
    for pool, batch in sorted(ctx.batches.items()):
        if not (wait or batch.result.done()):
            continue
        del ctx.batches[pool]
        rollout = ctx.writer.store.rollouts()[pool]
        _finish_batch(ctx, work, batch, rollout)
        _batch_ended(ctx, work.report, rollout)


def finish_batches(ctx: Context, report: CycleReport) -> None:
    """Wait for every batch under way and take its results into `report`."""
    if ctx.batches:
        batches = sorted(ctx.batches.items())
        log.info(
            "waiting for the batch(es) applying: %s",
            "; ".join(f"pool {pool}: {', '.join(b.hosts)}" for pool, b in batches),
        )
        collect(ctx, Cycle(report), wait=True)


def _finish_batch(ctx: Context, work: Cycle, batch: Batch, rollout: RolloutRecord) -> None:
    """Take a batch's apply in: hosts whose change applied and validated are back in
    service and done, the others halt."""
    result = batch.result.result()
    records = {h: ctx.writer.store.host(h) for h in batch.hosts}
    work.report.applied += len(batch.hosts)
    ctx.observe.hosts_acted("apply", len(batch.hosts))
    if batch.cluster:
        cluster_side.applied(ctx, work, result.cluster, batch.hosts)
    done, quarantined = [], []
    for host in batch.hosts:
        record, run = records[host], result.hosts[host]
        take_applied(ctx, work, record, run, batch.desired[host])
        work.report.outcomes[host].action = Action.ROLLED_OUT
        if run.succeeded and host in batch.remedies and not remedy.held(ctx, work, record, run):
            quarantined.append(host)  # it stays out of service
            continue
        if run.succeeded:
            ctx.writer.phase(record, RolloutPhase.APPLIED, "change applied and validated")
            done.append(host)
        else:
            out_of_service.halt(ctx, work, record, record.reason)
    out_of_service.relabel(ctx, work, [h for h in quarantined if h in batch.nodes], "replace")
    out_of_service.back_in_service(ctx, work, records, done, batch.nodes, batch.remedies)
    for host in done:
        _done(ctx, records[host])
    rollout.done.extend(done)


def _done(ctx: Context, record: HostRecord) -> None:
    """The host's change is through: out of the rollout, saying what it left as it was."""
    notes = ["left cordoned as it was before"] if record.keep_cordoned else []
    if record.slurm_drained == SlurmDrain.ADMIN:
        notes.append(
            f"left drained in Slurm as an administrator had it ({record.slurm_admin_reason})"
        )
    record.keep_cordoned = False
    out_of_rollout(record)
    ctx.writer.phase(record, None, "; ".join(["done", *notes]))


def _batch_ended(ctx: Context, report: CycleReport, rollout: RolloutRecord) -> None:
    rollout.last_batch = ctx.clock()
    in_pool = members(ctx, rollout.pool)
    if not any(r.rollout_phase for r in in_pool.values()):
        rollout.finished = ctx.clock()
        log.info("rollout of pool %s done: %d host(s)", rollout.pool, len(rollout.done))
    report.rollouts[rollout.pool] = decide.rollout_text(rollout, in_pool, "")
    ctx.writer.rollout(rollout)
