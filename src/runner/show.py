# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the CLI prints for people: a cycle's report, the status table's lines, a
rollout's and the cluster side's state in words."""

from __future__ import annotations

from runner.cycle import Action, CycleReport
from runner.engine import STAGES
from runner.health import Remedy, severity
from runner.rollout import IN_FLIGHT, RolloutPhase
from runner.state import ClusterRecord, ClusterStatus, HostRecord, HostStatus, RolloutRecord

UNWELL = (
    HostStatus.FAILED,
    HostStatus.REFUSED,
    HostStatus.UNREACHABLE,
    HostStatus.REBOOT_REQUIRED,
)


def unwell(record: HostRecord) -> bool:
    """Whether the host is not where it should be, for the exit code: a GPU asking
    for a reset or more counts."""
    return (
        severity(record.health.get("action", "")) >= severity("reset")
        or record.quarantined
        or record.status in UNWELL
        or record.rollout_phase == RolloutPhase.HALTED
        or record.rollout_reason.startswith("drain blocked")
    )


def print_report(report: CycleReport, hosts: dict[str, HostRecord], diffs: bool) -> None:
    took = report.finished - report.started
    print(
        f"cycle: {report.probed} probed, {report.planned} planned, {report.applied} applied "
        f"in {took:.1f} s" + (" (interrupted)" if report.interrupted else "")
    )
    for host, outcome in sorted(report.outcomes.items()):
        record = hosts.get(host)
        parts: list[str] = [outcome.action]
        if outcome.reasons:
            parts.append("because " + ", ".join(outcome.reasons))
        if outcome.corrective:
            parts.append("repaired " + ", ".join(outcome.corrective))
        if outcome.intentional:
            parts.append("changed as desired " + ", ".join(outcome.intentional))
        if outcome.pending and outcome.action == Action.PLANNED:
            parts.append("would change " + ", ".join(outcome.pending))
            if outcome.disruptive:
                parts.append("disruptive: rolled out in batches")
        if outcome.message:
            parts.append(outcome.message)
        if record is not None:
            parts.append(f"now {record.status}")
        print(f"  {host}: " + "; ".join(parts))
        if diffs:
            for component, texts in sorted(outcome.diffs.items()):
                for text in texts:
                    print(f"    [{component}] " + text.replace("\n", "\n      "))
    if report.cluster:
        print(f"  cluster side: {report.cluster}")
    if report.health_held:
        print(f"  GPU remediation held: {report.health_held}")
    for pool, text in sorted(report.rollouts.items()):
        print(f"  rollout of pool {pool}: {text}")


def age(now: float, then: float | None) -> str:
    if then is None:
        return "never"
    seconds = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def host_line(record: HostRecord) -> str:
    where = record.failed_stage or ""
    why = record.reason if record.reason.startswith(f"{where}:") else f"{where}: {record.reason}"
    gpus = Remedy.of(record.remedy) if record.quarantined else None
    if gpus is not None:
        said = gpus.evidence
        return f"quarantined for its GPUs ({said}); once seen to: runner release {record.name}"
    if record.quarantined:
        return f"quarantined ({why}); once fixed: runner release {record.name}"
    if record.status in UNWELL:
        return f"{record.status} ({why})"
    if record.status == HostStatus.DRIFTED and record.drift:
        return "drifted (" + ", ".join(sorted({d["component"] for d in record.drift})) + ")"
    if record.rollout_phase:
        reason = f": {record.rollout_reason}" if record.rollout_reason else ""
        return f"{record.status}; rollout {record.rollout_phase}{reason}"
    if any(s == "pre-installed" for s in record.stages.values()):
        pre = [k for k, v in record.stages.items() if v == "pre-installed"]
        return f"{record.status} (pre-installed: {', '.join(pre)})"
    if record.driver_adopted:
        return f"{record.status} (driver adopted)"
    return str(record.status)


def stage_text(record: HostRecord, stage: str) -> str:
    """`stage=status`; the MIG stage names the layout it keeps (mig=ready:all-balanced),
    the Slurm stage the node's state in Slurm (slurm_gres=ready:IDLE), the driver stage
    the version that answers (driver=ready:550.163.01) and a driver it adopted from the
    node (driver=ready:535.261.03:adopted)."""
    text = f"{stage}={record.stages[stage]}"
    if stage == "driver" and record.driver_version:
        text = f"{text}:{record.driver_version}"
    if stage == "mig" and record.mig_layout:
        return f"{text}:{record.mig_layout}"
    if stage == "slurm_gres" and record.slurm_state:
        return f"{text}:{record.slurm_state}"
    if stage == "driver" and record.driver_adopted:
        return f"{text}:adopted"
    return text


def rollout_line(
    pool: str, rollout: RolloutRecord, hosts: dict[str, HostRecord], now: float
) -> str:
    """A pool's rollout: done, in flight (with phases), queued, halted (with why)."""
    members = {h: r for h, r in hosts.items() if r.rollout_pool == pool and r.rollout_phase}
    flight = [f"{h} {r.rollout_phase}" for h, r in members.items() if r.rollout_phase in IN_FLIGHT]
    queued = [h for h, r in members.items() if r.rollout_phase == RolloutPhase.QUEUED]
    halted = [
        f"{h} ({r.rollout_reason})"
        for h, r in members.items()
        if r.rollout_phase == RolloutPhase.HALTED
    ]
    if rollout.finished is not None:
        when = f"finished {age(now, rollout.finished)}"
    else:
        when = f"started {age(now, rollout.started)}"
    parts = [f"{len(rollout.done)} done"]
    for label, items in (("in flight", flight), ("queued", queued), ("halted", halted)):
        if items:
            parts.append(f"{label} {len(items)}: {', '.join(items)}")
    return f"rollout of pool {pool} ({when}): " + "; ".join(parts)


def cluster_line(cluster: ClusterRecord) -> str:
    if cluster.status == ClusterStatus.FAILED:
        owed = f"; owes the labels of {', '.join(cluster.owed_hosts)}" if cluster.owed_hosts else ""
        return f"failed ({cluster.reason}){owed}"
    if cluster.status == ClusterStatus.DRIFTED:
        return "drifted (" + ", ".join(f"{d['kind']} {d['name']}" for d in cluster.drift) + ")"
    return str(cluster.status)


def print_status(
    hosts: dict[str, HostRecord],
    cluster: ClusterRecord,
    rollouts: dict[str, RolloutRecord],
    now: float,
) -> None:
    """The status table: a line per host, then the cluster side and each rollout."""
    width = max([len(h) for h in hosts] + [4])
    os_width = max([len(r.os) for r in hosts.values()] + [2])
    print(
        f"{'HOST':<{width}}  {'OS':<{os_width}}  {'STATE':<44} {'RECONCILED':<11} "
        "CHANGED     STAGES"
    )
    for name, record in hosts.items():
        stages = " ".join(stage_text(record, s) for s in STAGES if s in record.stages)
        action = record.health.get("action", "none")
        if action != "none":
            stages += f" health={action}"
        reconciled, changed = age(now, record.last_reconcile), age(now, record.last_change)
        print(
            f"{name:<{width}}  {record.os or '-':<{os_width}}  {host_line(record):<44} "
            f"{reconciled:<11} {changed:<11} {stages}"
        )
        for address, gpu in (record.health.get("gpus") or {}).items():
            said = "; ".join(signal["detail"] for signal in gpu["signals"])
            print(f"{'':<{width}}    GPU {address} asks {gpu['action']}: {said}")
        owed = Remedy.of(record.remedy)
        if owed is not None and not record.quarantined:
            print(f"{'':<{width}}    GPU remediation owed: {owed.text}")
    if cluster.status != ClusterStatus.UNKNOWN:
        print(f"cluster side: {cluster_line(cluster)}, applied {age(now, cluster.last_apply)}")
    for pool, rollout in rollouts.items():
        print(rollout_line(pool, rollout, hosts, now))
