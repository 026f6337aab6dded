# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU remediation through the rollout machinery (docs/health.md).

After each probe, `found` keeps on the host's record what its GPUs ask for
(runner.health.owed: a GPU reset, a reboot, a replacement). A host that owes one joins
its pool's rollout ahead of changes, so the pool's budget caps how many hosts are out
at once; `hold` keeps every remediation from starting while too many hosts ask at
once (the circuit breaker). When its batch starts, the host is taken out of service
as for a disruptive change, with a Slurm reason naming the GPUs; then a host whose
GPUs ask for a replacement is quarantined (`quarantine_asked`), the others are reset
or rebooted, applied and read again (`apply`), and `held` decides whether the node
goes back into service or is quarantined because its GPUs ask again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from runner import health as gpu_health
from runner.cycle import Context, Cycle
from runner.engine import Engine, HostRun, RunResult
from runner.health import Remedy
from runner.rollout import RolloutPhase
from runner.state import HostRecord

log = logging.getLogger("runner")


def owes(record: HostRecord) -> Remedy | None:
    """The remediation a host owes (None: none, or it is quarantined for its GPUs)."""
    return None if record.quarantined else Remedy.of(record.remedy)


def said(record: HostRecord) -> str:
    owed = owes(record)
    return f"GPU remediation owed: {owed.text}" if owed else ""


def found(
    ctx: Context, record: HostRecord, reading: Mapping[str, Any], events: Sequence[Any]
) -> None:
    """Keep on the record what its GPUs ask for after this probe."""
    asking = gpu_health.asking(reading, events)
    remedy = gpu_health.owed(
        owes(record), asking, ctx.clock(), record.remedied_at, ctx.settings.health_window
    )
    ctx.writer.remedy(record, remedy)


def hold(ctx: Context, work: Cycle) -> None:
    """The circuit breaker: while too many hosts of the fleet ask for a GPU reset or a
    reboot at once, none not yet out of service is remediated (each stays owed, in
    service, until it is remediated or released); what is under way goes on."""
    records = {**ctx.writer.store.hosts(), **work.records}
    owing = sorted(
        h for h, r in records.items() if (o := owes(r)) and o.action in gpu_health.REMEDIATED
    )
    if not gpu_health.breaker_open(len(owing), ctx.settings.health_breaker):
        return
    held = [
        h
        for h in work.to_roll
        if owes(work.records[h]) and work.records[h].rollout_phase in (None, RolloutPhase.QUEUED)
    ]
    work.report.health_held = (
        f"{len(owing)} hosts ask for a GPU reset or a reboot at once ({', '.join(owing)}; "
        f"the breaker opens at {ctx.settings.health_breaker}): none is remediated "
        "automatically; see to them, then release them"
    )
    log.warning("GPU remediation held: %s", work.report.health_held)
    for host in held:
        work.to_roll.remove(host)
        work.report.say(host, f"GPU remediation held: {work.report.health_held}")
        ctx.writer.save(work.records[host])


def slurm_reason(records: Mapping[str, HostRecord], batch: Sequence[str]) -> str:
    """The Slurm drain reason for a batch with remediations: what each host's GPUs ask
    ("" when none does)."""
    owed = [(h, r) for h in batch if (r := owes(records[h]))]
    said = []
    for host, remedy in owed:
        evidence = "; ".join(e for found in remedy.gpus.values() for e in found)
        gpus = ", ".join(sorted(remedy.gpus))
        said.append(f"GPU {gpus} {remedy.action} ({evidence})" + (f" on {host}" * (len(owed) > 1)))
    return "; ".join(said)


def quarantine_asked(ctx: Context, work: Cycle, batch: Sequence[str]) -> list[str]:
    """Quarantine the batch's hosts (out of service now) whose GPUs ask for a
    replacement; the others are left to remediate and apply."""
    rest = []
    for host in batch:
        remedy = owes(work.records[host])
        if remedy is not None and remedy.action == "replace":
            ctx.writer.quarantine_gpus(work.records[host], remedy)
            work.report.say(host, f"GPU quarantined: {remedy.text}")
        else:
            rest.append(host)
    return rest


def asked(records: Mapping[str, HostRecord], batch: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What remediate.yml is asked to do on each of the batch's hosts that owes it."""
    return {
        h: {"action": r.action, "gpus": sorted(r.gpus)}
        for h in batch
        if (r := owes(records[h])) and r.action in gpu_health.REMEDIATED
    }


def apply(
    engine: Engine, hosts: Sequence[str], remedies: Mapping[str, Any], cluster: bool
) -> RunResult:
    """A batch's apply with remediations: the GPU resets and reboots first, then site.yml
    on every host whose remediation did not fail, then the remediated GPUs' health read
    again (each HostRun's `health`)."""
    fixed = engine.remediate(remedies) if remedies else RunResult({})
    failed = {h: run for h, run in fixed.hosts.items() if not run.succeeded}
    rest = [h for h in hosts if h not in failed]
    result = engine.converge(rest, check=False, cluster=cluster) if rest else RunResult({})
    result.hosts.update(failed)
    checked = [h for h in remedies if h not in failed]
    if checked:
        probes = engine.probe(checked)
        for host in checked:
            result.hosts[host].remedy = fixed.hosts[host].remedy
            result.hosts[host].health = probes[host].health
    return result


def held(ctx: Context, work: Cycle, record: HostRecord, run: HostRun) -> bool:
    """After a remediated host's apply validated: whether its GPUs now ask nothing
    (remedied: it goes back into service). If they ask again, or could not be read, it
    is quarantined with the new evidence."""
    before, did = owes(record), run.remedy or {}
    done = str(did.get("done") or (before.action if before else "reset"))
    reading = run.health or {}
    events = ctx.writer.health(record, reading) if run.health is not None else []
    asking = gpu_health.asking(reading, events)
    if run.health is None:
        asking = [gpu_health.Asking("?", "the GPUs' health could not be read", "replace")]
    if not asking:
        said = ctx.writer.remedied(record, done, str(did.get("reset_failed") or ""))
        work.report.say(record.name, said)
        return True
    again = gpu_health.owed(before, asking, ctx.clock(), None, 0.0) or Remedy("replace")
    why = f"asked again right after its {done}"
    quarantined = Remedy("replace", again.gpus, again.since, why, again.ids)
    ctx.writer.quarantine_gpus(record, quarantined)
    work.report.say(record.name, f"GPU quarantined: {quarantined.text}")
    return False
