# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Prometheus metrics of the reconcile loop, served on 127.0.0.1 by default.

The loop tells `Metrics` what happens (it is one of the loop's observers); nothing
here decides anything. Each reconciler has its own registry (no process-global
state), so tests can build as many as they like.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    start_http_server,
)

from runner import __version__
from runner.cycle import Action, CycleReport
from runner.engine import STAGES
from runner.health import severity
from runner.observe import HostUpdated, Observer
from runner.rollout import PHASES
from runner.state import HostStatus

# The GPU Operator's node status exporter (its nvidia-validator `metrics` command) sets
# these per node, 1 when the stage's barrier is open: here 1 when the host's stages
# pass. Same names and `node` label, so dashboards and alerts written for the operator
# read a gpufleet fleet. A series exists only where the stages are enabled.
NODE_READY_GAUGES = {
    "gpu_operator_node_driver_ready": ("driver",),
    "gpu_operator_node_toolkit_ready": ("toolkit", "runtime_config"),
    "gpu_operator_node_plugin_ready": ("device_plugin",),
    "gpu_operator_node_cuda_ready": ("validator",),
    "gpu_operator_node_driver_validation": ("validator",),
}
_READY = ("ready", "pre-installed")


class _Health(NamedTuple):
    """The GPUs' health per host and per GPU with a signal (docs/health.md), the host's
    remediation under way, the Xid events counted, the remediations ended and the
    breaker."""

    host: Gauge
    gpu: Gauge
    remediating: Gauge
    xids: Counter
    remediations: Counter
    breaker: Gauge


def _health(r: CollectorRegistry) -> _Health:
    health = Gauge(
        "gpufleet_host_gpu_health",
        "What the host's GPUs ask for (0 none, 1 watch, 2 reset, 3 reboot, 4 replace)",
        ["host"],
        registry=r,
    )
    gpu = Gauge(
        "gpufleet_gpu_health",
        "What a GPU with a health signal asks for (0 none, 1 watch, 2 reset, 3 reboot, "
        "4 replace), by PCI address and UUID; a GPU without a signal has no series",
        ["host", "gpu", "uuid"],
        registry=r,
    )
    remediating = Gauge(
        "gpufleet_host_gpu_remediation",
        "1 while a GPU reset or reboot the host's GPUs asked for is under way (the host "
        "queued for it or out of service)",
        ["host"],
        registry=r,
    )
    xids = Counter(
        "gpufleet_xid_events",
        "Xid events the driver logged, each counted once, by the GPU's PCI address, with "
        "the action it asks for",
        ["host", "gpu", "xid", "action"],
        registry=r,
    )
    remediations = Counter(
        "gpufleet_remediations",
        "GPU remediations ended: action reset or reboot, result held or quarantined "
        "(action replace: quarantined as the GPUs asked)",
        ["host", "action", "result"],
        registry=r,
    )
    breaker = Gauge(
        "gpufleet_health_breaker_open",
        "1 while too many hosts ask for GPU remediation at once and none is remediated",
        registry=r,
    )
    return _Health(health, gpu, remediating, xids, remediations, breaker)


def _liveness(r: CollectorRegistry) -> Gauge:
    """Series that exist from the reconciler's start, before any cycle ends, so that
    absence and staleness alerts hold during a long first converge."""
    Info("gpufleet_build", "The reconciler's version", registry=r).info({"version": __version__})
    last_cycle = Gauge(
        "gpufleet_reconcile_last_cycle_timestamp_seconds",
        "When the last reconcile cycle ended (the reconciler's start, until one has)",
        registry=r,
    )
    last_cycle.set(time.time())
    return last_cycle


def _node_ready(r: CollectorRegistry) -> dict[str, Gauge]:
    """The GPU Operator's node readiness gauges (NODE_READY_GAUGES), by name."""
    return {
        name: Gauge(name, f"1 while the host's {'+'.join(stages)} pass", ["node"], registry=r)
        for name, stages in NODE_READY_GAUGES.items()
    }


class Metrics(Observer):
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.last_cycle = _liveness(r)
        self.cycles = Counter(
            "gpufleet_reconcile_cycles", "Reconcile cycles run", ["result"], registry=r
        )
        self.duration = Histogram(
            "gpufleet_reconcile_cycle_duration_seconds",
            "How long one reconcile cycle took",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600),
            registry=r,
        )
        self.acted = Counter(
            "gpufleet_reconcile_hosts", "Hosts probed, planned or applied", ["phase"], registry=r
        )
        self.drifts = Counter(
            "gpufleet_drift_detected", "Drift found by the probe", ["component", "kind"], registry=r
        )
        self.changes = Counter(
            "gpufleet_changes",
            "Components changed on a host, corrective (drift repaired) or intentional",
            ["host", "component", "kind"],
            registry=r,
        )
        self.quarantines = Counter("gpufleet_quarantines", "Hosts put into quarantine", registry=r)
        self.host_status = Gauge(
            "gpufleet_host_status",
            "1 for the host's current status",
            ["host", "status"],
            registry=r,
        )
        self.stage_status = Gauge(
            "gpufleet_host_stage_status",
            "1 for each stage's current status on the host",
            ["host", "stage", "status"],
            registry=r,
        )
        self.quarantined = Gauge(
            "gpufleet_host_quarantined", "1 while the host is quarantined", ["host"], registry=r
        )
        self.rollout = Gauge(
            "gpufleet_rollout_hosts", "Hosts in each phase of a rollout", ["phase"], registry=r
        )
        self.health = _health(r)
        self.node_ready = _node_ready(r)
        self._phases: dict[str, str | None] = {}
        self._stages: dict[str, dict[str, str]] = {}
        self._gpus: dict[str, set[tuple[str, str, str]]] = {}

    def serve(self, address: str, port: int) -> None:
        start_http_server(port, addr=address, registry=self.registry)

    def drift_found(self, item: Mapping[str, Any]) -> None:
        self.drifts.labels(item["component"], item["kind"]).inc()

    def component_changed(self, host: str, component: str, kind: str) -> None:
        self.changes.labels(host, component, kind).inc()

    def hosts_acted(self, phase: str, count: int) -> None:
        self.acted.labels(phase).inc(count)

    def host_quarantined(self, host: str) -> None:
        self.quarantines.inc()

    def xid_logged(self, host: str, gpu: str, xid: int, action: str) -> None:
        self.health.xids.labels(host, gpu, str(xid), action).inc()

    def remediated(self, host: str, action: str, held: bool) -> None:
        self.health.remediations.labels(host, action, "held" if held else "quarantined").inc()

    def cycle_finished(self, report: CycleReport) -> None:
        failed = any(o.action == Action.FAILED for o in report.outcomes.values())
        self.cycles.labels(
            "interrupted" if report.interrupted else "failed" if failed else "ok"
        ).inc()
        self.duration.observe(report.finished - report.started)
        self.last_cycle.set(report.finished)
        self.health.breaker.set(int(bool(report.health_held)))

    def host_updated(self, record: HostUpdated) -> None:
        for status in HostStatus:
            self.host_status.labels(record.name, status).set(int(record.status == status))
        self.quarantined.labels(record.name).set(int(record.quarantined))
        if record.health:
            self.health.host.labels(record.name).set(severity(record.health))
            self._gpu_series(record)
        self.health.remediating.labels(record.name).set(int(record.remediating))
        previous = self._stages.get(record.name, {})
        for stage in STAGES:
            old, new = previous.get(stage), record.stages.get(stage)
            if old and old != new:
                self.stage_status.remove(record.name, stage, old)
            if new:
                self.stage_status.labels(record.name, stage, new).set(1)
        self._stages[record.name] = dict(record.stages)
        for name, stages in NODE_READY_GAUGES.items():
            # Stages turned off (or not run yet) do not count; none left: no series.
            statuses = [
                status
                for status in (record.stages.get(stage) for stage in stages)
                if status not in (None, "disabled", "not-a-gpu-node")
            ]
            if statuses:
                ready = all(status in _READY for status in statuses)
                self.node_ready[name].labels(record.name).set(int(ready))
            else:
                self.node_ready[name].remove(record.name)
        self._phases[record.name] = record.rollout_phase
        self._count_phases()

    def _gpu_series(self, record: HostUpdated) -> None:
        """A series per GPU with a signal; those of GPUs without one any more removed."""
        now = {(record.name, address, uuid): action for address, uuid, action in record.gpus}
        for labels in self._gpus.get(record.name, set()) - now.keys():
            self.health.gpu.remove(*labels)
        for labels, action in now.items():
            self.health.gpu.labels(*labels).set(severity(action))
        self._gpus[record.name] = set(now)

    def host_forgotten(self, host: str) -> None:
        """Drop every series of a host no longer in the inventory."""
        for metric in (
            self.host_status,
            self.stage_status,
            self.quarantined,
            self.changes,
            self.health.host,
            self.health.gpu,
            self.health.remediating,
            self.health.xids,
            self.health.remediations,
        ):
            metric.remove_by_labels({"host": host})
        for gauge in self.node_ready.values():
            gauge.remove(host)
        self._stages.pop(host, None)
        self._gpus.pop(host, None)
        self._phases.pop(host, None)
        self._count_phases()

    def _count_phases(self) -> None:
        for phase in PHASES:
            self.rollout.labels(phase).set(sum(p == phase for p in self._phases.values()))
