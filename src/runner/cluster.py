# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The cluster side of a cycle (when the inventory sets k8s_manifests_apply).

`due` reads the cluster probe: Node labels that drifted make their host owed, other
drift makes the objects owed, and a failed apply's debts carry over. `add_owed` puts
the owed hosts into the cycle's apply; `applied` records what an apply that
included the cluster side did to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runner.cycle import Action, Context, Cycle
from runner.engine import HostRun, ProbeResult
from runner.state import ClusterRecord, ClusterStatus, HistoryEntry, HistoryKind
from runner.words import drift_summary

# The component name of the cluster side in drift, history and outcomes.
COMPONENT = "cluster"


def due(ctx: Context, work: Cycle, probe: ProbeResult | None, reachable: Sequence[str]) -> None:
    """What the cluster side needs this cycle (`work.owed`, `work.cluster_objects`):
    the hosts whose Node labels are to be applied (with why) and whether its objects
    are. From the cluster probe and what an earlier failed apply still owes."""
    report, state = work.report, ctx.writer.store.cluster()
    owed = {h: ["cluster side owed"] for h in state.owed_hosts if h in reachable}
    objects = state.owed_objects
    if probe is None or not probe.reachable:
        state.status = ClusterStatus.FAILED
        state.reason = f"probe failed: {probe.reason if probe else 'no result'}"
        report.cluster, report.cluster_failed = state.reason, True
        ctx.writer.cluster(state)
        return
    if not probe.recorded:
        objects = True
        for host in reachable:
            owed.setdefault(host, []).append("cluster side not recorded")
    drift = _drift(probe, set(ctx.applying()))
    events = []
    for item in drift:
        labelled = str(item.get("host"))
        if item.get("kind") == "node-labels" and labelled in reachable:
            owed.setdefault(labelled, []).append("cluster drift")
            events.append(
                ctx.writer.cluster_entry(HistoryKind.DRIFT, drift_summary(item), labelled)
            )
        else:
            objects = True
            events.append(ctx.writer.cluster_entry(HistoryKind.DRIFT, drift_summary(item)))
    state.drift = drift
    if drift:
        state.status = ClusterStatus.DRIFTED
        report.cluster = "drifted: " + "; ".join(drift_summary(d) for d in drift)
    else:
        if probe.recorded and not owed and not objects:
            state.status, state.reason = ClusterStatus.CONVERGED, ""
        report.cluster = str(state.status)
    ctx.writer.cluster(state, events, found=drift)
    work.owed, work.cluster_objects = owed, objects
    work.cluster_drifted = frozenset(h for h, r in owed.items() if "cluster drift" in r)


def _drift(probe: ProbeResult, applying: set[str]) -> list[dict[str, Any]]:
    """The cluster's drift, less the labels of hosts whose batch applies (that
    apply, its cluster side included, is to change them)."""
    return [
        item
        for item in probe.drift
        if item.get("kind") != "node-labels" or str(item.get("host")) not in applying
    ]


def add_owed(work: Cycle) -> None:
    """Put the hosts whose Node labels the cluster side owes into this cycle's apply,
    unless something else already takes them or they failed: applying them changes
    nothing on the node (the probe found it as recorded) and relabels their Nodes."""
    outcomes = work.report.outcomes
    for host, why in sorted(work.owed.items()):
        known = outcomes.get(host)
        if host in work.to_apply or host in work.to_roll:
            continue
        if known is not None and known.action in (Action.FAILED, Action.SKIPPED, Action.WAITING):
            continue
        if known is not None and known.action == Action.PLANNED:
            known.reasons.extend(r for r in why if r not in known.reasons)
        else:
            work.outcome(host, Action.PLANNED, reasons=why)
        work.to_apply.append(host)


def applied(
    ctx: Context,
    work: Cycle,
    run: HostRun | None,
    hosts: Sequence[str],
    drifted: frozenset[str] = frozenset(),
) -> None:
    """Record the cluster side's part of an apply that included it (`drifted`: the
    hosts whose Node labels it repaired)."""
    report, writer = work.report, ctx.writer
    state = writer.store.cluster()
    if run is None or not run.succeeded:
        reason = "; ".join(run.failures) if run else "the cluster side did not run"
        state.status, state.reason = ClusterStatus.FAILED, reason
        state.owed_hosts = sorted(set(state.owed_hosts) | set(hosts))
        state.owed_objects = True
        report.cluster = f"failed: {reason}; owed to the next cycle"
        report.cluster_failed = True
        writer.cluster(state, [writer.cluster_entry(HistoryKind.FAILURE, reason)])
        return
    repaired = bool(state.drift or state.owed_hosts or state.owed_objects)
    tasks = sorted({c.task for c in run.changes})
    events = _change_entries(ctx, work, tasks, repaired, sorted(drifted & set(hosts)))
    fresh = ClusterRecord(
        status=ClusterStatus.CONVERGED,
        owed_hosts=sorted(set(state.owed_hosts) - set(hosts)),
        last_apply=ctx.clock(),
    )
    report.cluster = ("repaired" if repaired and tasks else "applied") + (
        f" ({len(tasks)} task(s) changed)" if tasks else ", no change"
    )
    writer.cluster(fresh, events)


def _change_entries(
    ctx: Context, work: Cycle, tasks: Sequence[str], repaired: bool, relabelled: Sequence[str]
) -> list[HistoryEntry]:
    """History entries for what an apply changed on the cluster side; the hosts
    whose Node labels it repaired are told so in their outcome."""
    if not tasks:
        return []
    kind = HistoryKind.CORRECTIVE if repaired else HistoryKind.INTENTIONAL
    summary = f"{len(tasks)} task(s) changed: " + "; ".join(tasks)
    events = [ctx.writer.cluster_entry(kind, summary)]
    outcomes: Mapping[str, Any] = work.report.outcomes
    for host in relabelled:
        events.append(ctx.writer.cluster_entry(HistoryKind.CORRECTIVE, "Node labels", host))
        outcome = outcomes.get(host)
        if outcome is not None and COMPONENT not in outcome.corrective:
            outcome.corrective.append(COMPONENT)
    return events
