# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Taking a rollout batch out of service and bringing it back: Kubernetes cordon and
drain, the Slurm drain and its wait for the node's jobs, and after the change the
Slurm resume and the uncordon. Each step's failure halts its host, which stays out
of service (cordoned, drained) until an operator releases it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from runner import decide, remedy
from runner.cycle import Context, Cycle
from runner.decide import SlurmNext
from runner.rollout import RolloutPhase, slurm_drain
from runner.state import HostRecord, SlurmDrain

# (action, the phases it is taken in, the phase it leads to)
_KUBERNETES_STEPS = (
    ("cordon", (RolloutPhase.QUEUED,), RolloutPhase.CORDONED),
    ("drain", (RolloutPhase.QUEUED, RolloutPhase.CORDONED), RolloutPhase.DRAINED),
)


def halt(ctx: Context, work: Cycle, record: HostRecord, reason: str) -> None:
    ctx.writer.halt(record, reason)
    work.report.say(record.name, f"rollout halted: {reason}")


def kubernetes(ctx: Context, work: Cycle, nodes: Sequence[str]) -> bool:
    """Cordon, then drain, the batch's Kubernetes nodes: True once all are drained.
    A drain a PodDisruptionBudget refuses leaves its node cordoned and the rollout
    waiting (no release needed: the next cycle drains again); another failure halts."""
    records = work.records
    for action, before, after in _KUBERNETES_STEPS:
        todo = [h for h in nodes if records[h].rollout_phase in before]
        if not todo:
            continue
        # A node taken out for its GPUs is labelled with what they ask, as it is cordoned.
        asked = {h: r.action for h in todo if action == "cordon" and (r := remedy.owes(records[h]))}
        result = ctx.engine.node_action(action, todo, asked)
        for host in todo:
            run = result.hosts[host]
            failure = "; ".join(run.failures)
            if not run.succeeded and action == "drain" and decide.blocked_by_budget(failure):
                ctx.writer.drain_blocked(records[host], failure)
                work.report.say(
                    host,
                    f"rollout waits, node cordoned; drain blocked: {failure}; retried next cycle",
                )
                return False
            if not run.succeeded:
                halt(ctx, work, records[host], f"{action} failed: {failure}")
                return False
            if action == "cordon" and run.action_changed is False:
                # Cordoned by someone else before the rollout: it stays so after.
                records[host].keep_cordoned = True
            ctx.writer.phase(records[host], after, f"{action}ed")
    return True


def relabel(ctx: Context, work: Cycle, nodes: Sequence[str], health: str | None) -> None:
    """Give cordoned Kubernetes nodes a new GPU health label, or (None) remove it
    (cordoning a node cordoned already changes nothing else); a failure is said."""
    if not nodes:
        return
    result = ctx.engine.node_action("cordon", nodes, dict.fromkeys(nodes, health))
    for host in nodes:
        if not result.hosts[host].succeeded:
            failure = "; ".join(result.hosts[host].failures)
            work.report.say(host, f"setting its GPU health label to {health} failed: {failure}")


def slurm(ctx: Context, work: Cycle, batch: Sequence[str], reason: str) -> bool:
    """Drain the batch's Slurm nodes (slurm_drain) saying `reason`, and wait for their
    jobs: True once none runs a job. A node with jobs holds the batch back, drained, and is
    asked again next cycle; past its slurm_drain_timeout it halts, naming them.
    Every host is taken in (who drained it, since when) before the answer."""
    asked = [h for h in batch if slurm_drain(h, work.hostvars[h])[0] != "false"]
    if not asked:
        return True
    result = ctx.engine.slurm_action("drain", asked, reason)
    now = ctx.clock()
    ready = True
    for host in asked:
        run, record = result.hosts[host], work.records[host]
        if run.succeeded and run.slurm and run.slurm.get("managed"):
            _drained_by(record, run.slurm, now)
        waited = now - (record.slurm_drain_started or now)
        step = decide.slurm_step(run, waited, slurm_drain(host, work.hostvars[host])[1])
        if step.next == SlurmNext.HALT:
            halt(ctx, work, record, step.reason)
        elif step.next == SlurmNext.WAIT:
            if record.rollout_phase == RolloutPhase.QUEUED:
                ctx.writer.phase(record, RolloutPhase.CORDONED, "drained in Slurm")
            record.rollout_reason = step.reason
            ctx.writer.save(record)
            work.report.say(host, f"rollout waits: {step.reason}")
        elif step.next == SlurmNext.DRAINED and record.rollout_phase in (
            RolloutPhase.QUEUED,
            RolloutPhase.CORDONED,
        ):
            ctx.writer.phase(record, RolloutPhase.DRAINED, "drained in Slurm; no job left")
        elif step.next == SlurmNext.DRAINED:
            ctx.writer.save(record)
        ready = ready and step.next in (SlurmNext.DRAINED, SlurmNext.UNMANAGED)
    return ready


def _drained_by(record: HostRecord, answer: dict[str, object], now: float) -> None:
    """Take in who has the node drained in Slurm. Asked afresh each time: an
    administrator may have resumed the node since (then this drain is gpufleet's),
    or drained it before gpufleet did."""
    record.slurm_state = str(answer.get("state") or record.slurm_state)
    if answer.get("admin_drained"):
        record.slurm_drained = SlurmDrain.ADMIN
        record.slurm_admin_reason = str(answer.get("reason_before") or "")
    else:
        record.slurm_drained, record.slurm_admin_reason = SlurmDrain.GPUFLEET, ""
    if record.slurm_drain_started is None:
        record.slurm_drain_started = now


def back_in_service(
    ctx: Context,
    work: Cycle,
    records: Mapping[str, HostRecord],
    applied: list[str],
    nodes: Sequence[str],
    remedied: Collection[str] = (),
) -> None:
    """Resume in Slurm the hosts gpufleet drained, uncordon the Kubernetes nodes it
    cordoned, their GPU health label removed (also from `remedied` nodes that stay
    cordoned for someone else); a host whose resume or uncordon fails halts and is
    taken out of `applied`."""
    resume = [h for h in applied if records[h].slurm_drained == SlurmDrain.GPUFLEET]
    if resume:
        resumed = ctx.engine.slurm_action("resume", resume)
        for host in resume:
            state = (resumed.hosts[host].slurm or {}).get("state")
            records[host].slurm_state = str(state or records[host].slurm_state)
            if not resumed.hosts[host].succeeded:
                failure = "; ".join(resumed.hosts[host].failures)
                halt(ctx, work, records[host], f"Slurm resume failed: {failure}")
                applied.remove(host)
    back = [h for h in applied if h in nodes]
    uncordon = [h for h in back if not records[h].keep_cordoned]
    if uncordon:
        uncordoned = ctx.engine.node_action("uncordon", uncordon, dict.fromkeys(uncordon))
        for host in uncordon:
            if not uncordoned.hosts[host].succeeded:
                halt(ctx, work, records[host], "uncordon failed")
                applied.remove(host)
    relabel(ctx, work, [h for h in back if records[h].keep_cordoned and h in remedied], None)
