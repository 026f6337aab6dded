# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reconcile loop's decisions on fake time, with a fake Ansible.

The fake fleet behaves like the real one where the loop can tell: a host's probe
reports drift until an apply repairs it, a plan lists the components an apply would
change, an unreachable host fails every run, a driver change is disruptive.
(tests/unit/test_runner_e2e.py runs the loop against real simulated nodes.)
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runner import __version__
from runner.engine import CLUSTER_HOST, STAGES, Change, HostRun, ProbeResult, RunResult
from runner.reconcile import (
    CycleReport,
    Observer,
    Observers,
    Reconciler,
    Settings,
    Stop,
    backoff_delay,
    drift_summary,
    release,
)
from runner.rollout import PolicyError
from runner.state import StateStore

READY = {stage: {"status": "ready"} for stage in STAGES}


@dataclass
class Node:
    variables: dict[str, Any] = field(default_factory=dict)
    # What an apply would change (component -> disruptive?), as the plan shows it.
    pending: dict[str, bool] = field(default_factory=dict)
    drift: list[dict[str, Any]] = field(default_factory=list)
    recorded: bool = False
    reachable: bool = True
    broken_stage: str | None = None
    # The driver waits for a reboot (nouveau holds the GPUs, driver_reboot_policy never).
    needs_reboot: bool = False
    # A check-mode run fails on this node with this message (e.g. on its broken sources).
    plan_failure: str = ""
    # What the probe reports of the GPUs' health (node_state's `health`), if anything.
    health: dict[str, Any] | None = None
    # What a GPU remediation leaves the health reading (None: no signal on any GPU, the
    # Xid events read before kept), and the failure it ends with, if any.
    health_after_remedy: dict[str, Any] | None = None
    remedy_failure: str = ""


@dataclass
class FakeCluster:
    """The cluster side as the loop sees it: a record of the last apply, drift the
    probe reports until an apply that includes the cluster side repairs it, and an
    API server that may be gone."""

    recorded: bool = True
    drift: list[dict[str, Any]] = field(default_factory=list)
    api_up: bool = True


BLOCKED = (
    "drain of node {host} failed: Failed to delete pod ml/train-0 due to: Cannot evict pod "
    "as it would violate the pod's disruption budget. Blocked by PodDisruptionBudget "
    "ml/train allows no disruption (1 healthy, 1 needed)"
)
REFUSED = "Failed to get client due to HTTPSConnectionPool: connection refused"


def label_drift(host: str) -> dict[str, Any]:
    return {
        "component": "cluster",
        "kind": "node-labels",
        "name": host,
        "host": host,
        "recorded": {"nvidia.com/gpu.present": "true"},
        "current": {"nvidia.com/gpu.present": None},
    }


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeEngine:
    """Ansible as the loop sees it; `calls` records every run and its hosts."""

    def __init__(self, nodes: dict[str, Node], project: str = "v1") -> None:
        self.nodes = nodes
        self.project = project
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.settings_checks: list[tuple[str, ...]] = []
        self.on_apply: Any = None
        self.cluster = FakeCluster()
        # Runs that included the cluster side: (plan | apply | probe, hosts).
        self.cluster_runs: list[tuple[str, tuple[str, ...]]] = []
        # The GPU health label on each Node, and every value it was given, in order.
        self.health_labels: dict[str, str] = {}
        self.health_labelled: list[tuple[str, str]] = []
        # Nodes cordoned now, and nodes whose drain a PodDisruptionBudget refuses.
        self.cordoned: set[str] = set()
        self.budget_blocks: set[str] = set()
        # Slurm: the hosts where slurmd runs, the jobs on each, the drained ones (with
        # their reason), and every Slurm action asked for.
        self.slurm_nodes: set[str] = set()
        self.slurm_jobs: dict[str, list[str]] = {}
        self.slurm_drained: dict[str, str] = {}
        self.slurm_calls: list[tuple[str, tuple[str, ...]]] = []
        # Every remediation asked: host -> {action, gpus}, one mapping per run.
        self.remedies: list[dict[str, dict[str, Any]]] = []

    def inventory(self, limit: str | None = None) -> dict[str, dict[str, Any]]:
        names = [n for n in self.nodes if not limit or n == limit]
        return {n: dict(self.nodes[n].variables) for n in names}

    def inventory_hosts(self) -> list[str]:
        return list(self.nodes)

    def desired_hashes(self, hostvars: Any) -> dict[str, str]:
        return {h: f"{self.project}:{sorted(v.items())}" for h, v in hostvars.items()}

    def check_settings(self, hosts: Sequence[str]) -> dict[str, str]:
        """A variable named `bad` stands for any setting a stage would refuse."""
        self.settings_checks.append(tuple(hosts))
        return {
            h: f"bad: expected good, got {self.nodes[h].variables['bad']!r}."
            for h in hosts
            if "bad" in self.nodes[h].variables
        }

    def probe(self, hosts: Sequence[str], cluster: bool = False) -> dict[str, ProbeResult]:
        self.calls.append(("probe", tuple(hosts)))
        results = {
            h: ProbeResult(
                h,
                reachable=self.nodes[h].reachable,
                recorded=self.nodes[h].recorded,
                drift=list(self.nodes[h].drift),
                health=self.nodes[h].health,
            )
            for h in hosts
        }
        if cluster:
            self.cluster_runs.append(("probe", tuple(hosts)))
            side = self.cluster
            results[CLUSTER_HOST] = ProbeResult(
                CLUSTER_HOST,
                reachable=side.api_up,
                recorded=side.recorded,
                drift=list(side.drift),
                reason="" if side.api_up else REFUSED,
            )
        return results

    def _run(self, host: str) -> HostRun:
        node = self.nodes[host]
        if not node.reachable:
            return HostRun(host, reachable=False, failures=["unreachable: no route"])
        stages = {s: dict(v) for s, v in READY.items()}
        for component, disruptive in node.pending.items():
            if disruptive and component in stages:
                stages[component]["disruptive"] = True
        stages["mig"]["config"] = node.variables.get("mig_config", "")
        # What the driver stage reads of the node: its OS and the driver that answers.
        stages["driver"].update(
            os="debian 12", version=node.variables.get("driver_version", "535.261.03")
        )
        if node.broken_stage:
            stages[node.broken_stage].update(status="failed", reason="it broke")
        if node.needs_reboot:
            stages["driver"].update(status="reboot-required", reason="reboot the node")
            for later in STAGES[1:]:
                stages[later] = {"status": "not-reached"}
        changes = [Change(c, f"change {c}", f"-old\n+new {c}") for c in sorted(node.pending)]
        return HostRun(host, changes=changes, stages=stages)

    def converge(self, hosts: Sequence[str], check: bool, cluster: bool = False) -> RunResult:
        self.calls.append(("plan" if check else "apply", tuple(hosts)))
        result = RunResult({h: self._run(h) for h in hosts})
        for h in hosts:
            if check and self.nodes[h].plan_failure:
                result.hosts[h] = HostRun(h, failures=[self.nodes[h].plan_failure])
        if cluster:
            self.cluster_runs.append(("plan" if check else "apply", tuple(hosts)))
            result.cluster = self._cluster_run(hosts, check)
        if not check:
            for h in hosts:
                node = self.nodes[h]
                if node.reachable and not node.broken_stage and not node.needs_reboot:
                    node.pending.clear()
                    node.drift.clear()
                    node.recorded = True
            if self.on_apply:
                self.on_apply(hosts)
        return result

    def _cluster_run(self, hosts: Sequence[str], check: bool) -> HostRun:
        side = self.cluster
        if not side.api_up:
            return HostRun(CLUSTER_HOST, failures=[f"k8s_manifests: Apply the objects: {REFUSED}"])
        # Labels are repaired only for the hosts in the run (they have facts in it).
        repaired = [d for d in side.drift if d["kind"] != "node-labels" or d["host"] in hosts]
        changes = (
            [Change("k8s_manifests", "Apply the objects")] if repaired or not side.recorded else []
        )
        if not check:
            side.drift = [d for d in side.drift if d not in repaired]
            side.recorded = True
        return HostRun(CLUSTER_HOST, changes=changes)

    def beside(self) -> FakeEngine:
        return self

    def remediate(self, remedies: Any) -> RunResult:
        """A GPU reset or a reboot: it clears what the node's `health_after_remedy` says."""
        self.calls.append(("remediate", tuple(sorted(remedies))))
        self.remedies.append({h: dict(r) for h, r in remedies.items()})
        runs = {}
        for host, asked in remedies.items():
            node = self.nodes[host]
            if node.remedy_failure:
                runs[host] = HostRun(host, failures=[node.remedy_failure])
                continue
            before = node.health or {}
            node.health = node.health_after_remedy or {
                "action": "none",
                "gpus": {a: {"action": "none", "signals": []} for a in before.get("gpus") or {}},
                "xid_events": list(before.get("xid_events") or []),
                "boot_id": before.get("boot_id", "boot-1"),
            }
            runs[host] = HostRun(host, remedy={"done": asked["action"], "waits": False})
        return RunResult(runs)

    def node_action(
        self, action: str, hosts: Sequence[str], health: Mapping[str, str | None] | None = None
    ) -> RunResult:
        self.calls.append((action, tuple(hosts)))
        runs = {}
        for host, value in (health or {}).items():
            if value is None:
                self.health_labels.pop(host, None)
            else:
                self.health_labels[host] = value
                self.health_labelled.append((host, value))
        for host in hosts:
            if action == "drain" and host in self.budget_blocks:
                runs[host] = HostRun(host, failures=[BLOCKED.format(host=host)])
            elif action == "cordon":
                runs[host] = HostRun(host, action_changed=host not in self.cordoned)
                self.cordoned.add(host)
            else:
                if action == "uncordon":
                    self.cordoned.discard(host)
                runs[host] = HostRun(host, action_changed=True)
        return RunResult(runs)

    def slurm_action(self, action: str, hosts: Sequence[str], reason: str = "") -> RunResult:
        self.slurm_calls.append((action, tuple(hosts)))
        runs = {}
        for host in hosts:
            if host not in self.slurm_nodes:
                runs[host] = HostRun(host, slurm={"managed": False})
                continue
            before = self.slurm_drained.get(host)
            ours = (before or "").startswith("gpufleet:")
            if action == "drain" and before is None:
                self.slurm_drained[host] = f"gpufleet: {reason}"
            if action == "resume" and ours:
                del self.slurm_drained[host]
            slurm = {
                "managed": True,
                "state": "IDLE+DRAIN" if host in self.slurm_drained else "IDLE",
                "reason_before": before or "",
                "admin_drained": before is not None and not ours,
                "jobs": list(self.slurm_jobs.get(host, [])) if action == "drain" else [],
            }
            runs[host] = HostRun(host, slurm=slurm)
        return RunResult(runs)

    def acted_on(self, kind: str) -> list[str]:
        return [h for call, hosts in self.calls if call == kind for h in hosts]


def drift(component: str = "runtime_config") -> list[dict[str, Any]]:
    return [
        {
            "component": component,
            "kind": "file",
            "name": "/etc/containerd/config.toml",
            "recorded": {"sha256": "a" * 64, "mode": "0644", "owner": "root", "group": "root"},
            "current": {"sha256": "b" * 64, "mode": "0644", "owner": "root", "group": "root"},
        }
    ]


@pytest.mark.parametrize(
    ("item", "summary"),
    [
        (
            {
                "kind": "service",
                "name": "dcgm-exporter.service",
                "recorded": {"active_state": "active", "unit_file_state": "enabled"},
                "current": {"active_state": "inactive", "unit_file_state": "enabled"},
            },
            "service dcgm-exporter.service: active_state active -> inactive",
        ),
        (
            {
                "kind": "package",
                "name": "nvidia-container-toolkit",
                "recorded": {"version": "1.17.8-1", "held": True},
                "current": None,
            },
            "package nvidia-container-toolkit: gone (was held True, version 1.17.8-1)",
        ),
        (
            {"kind": "driver", "name": "nvidia", "recorded": "535.261.03", "current": "550.127.05"},
            "driver nvidia: 535.261.03 -> 550.127.05",
        ),
    ],
)
def test_a_drift_summary_names_what_changed(item: dict[str, Any], summary: str) -> None:
    assert drift_summary(item) == summary


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    with StateStore(tmp_path / "state") as opened:
        yield opened


def make(
    store: StateStore, nodes: dict[str, Node], clock: FakeClock | None = None, **settings: Any
) -> tuple[Reconciler, FakeEngine, FakeClock]:
    engine = FakeEngine(nodes)
    clock = clock or FakeClock()
    reconciler = Reconciler(
        engine,
        store,
        Settings(**settings),
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(7),
    )
    return reconciler, engine, clock


def fresh_fleet(*names: str) -> dict[str, Node]:
    return {n: Node(pending={"driver": False, "toolkit": False}) for n in names}


def converged(store: StateStore, *names: str) -> tuple[Reconciler, FakeEngine, FakeClock]:
    """A fleet after its first cycle: every host applied and recorded."""
    reconciler, engine, clock = make(store, fresh_fleet(*names))
    reconciler.cycle()
    engine.calls.clear()
    return reconciler, engine, clock


def upgrade_driver(engine: FakeEngine, *hosts: str, **variables: Any) -> None:
    """A new driver version asked for on converged hosts: a disruptive change."""
    for host in hosts:
        engine.nodes[host].variables = {"driver_version": "550.127.05", **variables}
        engine.nodes[host].pending = {"driver": True}


def test_first_contact_is_planned_then_a_harmless_change_applied(store: StateStore) -> None:
    reconciler, engine, _ = make(store, fresh_fleet("a", "b"))
    report = reconciler.cycle()
    assert [call for call, _ in engine.calls] == ["probe", "plan", "apply"]
    assert engine.acted_on("apply") == ["a", "b"]
    assert report.outcomes["a"].intentional == ["driver", "toolkit"]
    assert report.outcomes["a"].corrective == []
    assert {h.status for h in store.hosts().values()} == {"converged"}
    assert [e.kind for e in store.history("a")] == ["intentional", "intentional"]


def test_first_contact_with_a_disruptive_change_goes_through_the_rollout(
    store: StateStore,
) -> None:
    """A node gpufleet has never seen, whose plan would replace a loaded driver (one
    someone else installed, running jobs): queued in its pool's rollout, not applied."""
    nodes = fresh_fleet("a", "b", "c")
    nodes["b"].pending = nodes["c"].pending = {"driver": True}
    reconciler, engine, _ = make(store, nodes)
    report = reconciler.cycle()
    assert engine.acted_on("plan") == ["a", "b", "c"]
    assert applies(engine) == [("a",), ("b",)], "a at once; b in the rollout's first batch"
    assert report.rollouts == {"all": "1 done, 1 queued"}
    assert store.host("c").rollout_phase == "queued"


def test_steady_state_only_probes(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a", "b", "c")
    report = reconciler.cycle()
    assert engine.calls == [("probe", ("a", "b", "c"))]
    assert report.hosts_with("probed") == ["a", "b", "c"]


def test_a_host_whose_settings_are_refused_is_left_alone_until_they_are_fixed(
    store: StateStore,
) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    assert engine.settings_checks == [("a", "b")]
    engine.nodes["b"].variables = {"bad": "x"}
    engine.nodes["b"].pending = {"toolkit": False}
    for _ in range(3):
        report = reconciler.cycle()
        assert engine.calls[-1] == ("probe", ("a",)), "b is neither probed nor changed"
        assert "bad: expected good, got 'x'" in report.outcomes["b"].message
    record = store.host("b")
    assert (record.status, record.failed_stage, record.quarantined) == (
        "refused",
        "settings",
        False,
    )
    assert record.next_attempt is None or record.next_attempt <= reconciler.clock()
    assert [e.kind for e in store.history("b")].count("failure") == 1, "said once"
    # a's settings, unchanged, are not checked again; b's are, every cycle, until fixed.
    assert engine.settings_checks[1:] == [("b",)] * 3
    engine.nodes["b"].variables = {"driver_version": "535.261.03"}
    report = reconciler.cycle()
    assert report.outcomes["b"].intentional == ["toolkit"]
    assert store.host("b").status == "converged"


def test_a_new_reconciler_checks_only_the_settings_no_apply_has_reached(
    store: StateStore,
) -> None:
    """`reconcile --once` from a timer is a new process each time: the settings of
    hosts whose desired state an apply reached passed then, and are not run again."""
    _, engine, clock = converged(store, "a", "b")
    engine.nodes["b"].variables = {"driver_version": "535.261.03"}
    again, fresh, _ = make(store, engine.nodes, clock=clock)
    again.cycle()
    assert fresh.settings_checks == [("b",)]


APT_BROKEN = "driver: Update the package lists: E: Malformed entry 1 in list file"


def test_a_plan_that_fails_on_drifted_files_does_not_keep_them_from_repair(
    store: StateStore,
) -> None:
    """A sources file mangled by hand breaks the check-mode plan itself: the host is
    still repaired, since putting back recorded files and services needs no plan."""
    reconciler, engine, _ = converged(store, "a", "b")
    engine.nodes["a"].drift = drift("driver")
    engine.nodes["a"].pending = {"driver": False}
    engine.nodes["a"].plan_failure = APT_BROKEN
    report = reconciler.cycle()
    assert engine.calls == [("probe", ("a", "b")), ("plan", ("a",)), ("apply", ("a",))]
    assert "repaired without a plan" in report.outcomes["a"].message
    assert APT_BROKEN in report.outcomes["a"].message
    assert report.outcomes["a"].corrective == ["driver"]
    assert store.host("a").status == "converged"


def test_a_failed_plan_of_drift_that_could_disrupt_says_why_nothing_was_applied(
    store: StateStore,
) -> None:
    reconciler, engine, clock = converged(store, "a")
    engine.nodes["a"].drift = [
        *drift("driver"),
        {
            "component": "driver",
            "kind": "package",
            "name": "nvidia-kernel-dkms",
            "recorded": {"version": "535.261.03-1", "held": True},
            "current": {"version": "535.309.01-1", "held": True},
        },
    ]
    engine.nodes["a"].plan_failure = APT_BROKEN
    for _ in range(5):
        clock.sleep(4000)
        report = reconciler.cycle()
        assert "apply" not in [call for call, _ in engine.calls]
    message = report.outcomes["a"].message
    assert "not applied without a plan, since repairing package nvidia-kernel-dkms" in message
    assert "run site.yml --limit a" in message
    record = store.host("a")
    assert record.quarantined
    (quarantine,) = [e for e in store.history("a") if e.kind == "quarantine"]
    assert APT_BROKEN in quarantine.summary
    assert quarantine.summary.endswith("once it is fixed: python -m runner release a")


def test_drift_is_planned_repaired_on_that_host_only_and_called_corrective(
    store: StateStore,
) -> None:
    reconciler, engine, clock = converged(store, "a", "b", "c")
    engine.nodes["b"].drift = drift()
    engine.nodes["b"].pending = {"runtime_config": False}
    probed_at = clock.now
    engine.on_apply = lambda hosts: clock.sleep(120)
    report = reconciler.cycle()
    # "Reconciled" is when the host's repair ended; a host only probed, at the probe.
    assert store.host("b").last_reconcile == probed_at + 120
    assert store.host("a").last_reconcile == probed_at
    assert engine.acted_on("plan") == ["b"]
    assert engine.acted_on("apply") == ["b"]
    assert report.outcomes["b"].corrective == ["runtime_config"]
    assert report.outcomes["b"].intentional == []
    assert [(e.kind, e.component) for e in store.history("b")][-2:] == [
        ("drift", "runtime_config"),
        ("corrective", "runtime_config"),
    ]
    seen = store.history("b", kinds=["drift"])[-1].summary
    assert seen == "file /etc/containerd/config.toml: sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb"
    engine.calls.clear()
    reconciler.cycle()
    assert engine.calls == [("probe", ("a", "b", "c"))]


def test_drift_that_cannot_disrupt_is_repaired_without_a_plan(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    engine.nodes["a"].drift = drift("exporter")
    engine.nodes["a"].pending = {"exporter": False}
    report = reconciler.cycle()
    assert engine.calls == [("probe", ("a", "b")), ("apply", ("a",))]
    assert report.outcomes["a"].corrective == ["exporter"]
    assert report.planned == 0


def test_drift_with_a_desired_change_is_planned_first(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a")
    engine.nodes["a"].drift = drift("exporter")
    engine.nodes["a"].variables = {"driver_version": "550.127.05"}
    engine.nodes["a"].pending = {"exporter": False, "driver": True}
    reconciler.cycle()
    assert [call for call, _ in engine.calls][:2] == ["probe", "plan"]
    assert engine.acted_on("apply") == ["a"], "applied once, through the rollout"
    assert [e.component for e in store.history("a", kinds=["rollout"])][-1] == "done"


def test_changed_variable_is_intentional(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    engine.nodes["a"].variables = {"exporter_collectors": ["DCGM_FI_DEV_GPU_UTIL"]}
    engine.nodes["a"].pending = {"exporter": False}
    report = reconciler.cycle()
    assert engine.acted_on("plan") == ["a"]
    assert report.outcomes["a"].reasons == ["desired state changed"]
    assert report.outcomes["a"].intentional == ["exporter"]
    assert store.history("a", kinds=["intentional"])[-1].component == "exporter"


def test_desired_change_with_nothing_to_do_is_only_planned(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a")
    engine.nodes["a"].variables = {"a_comment": "no effect"}
    reconciler.cycle()
    assert engine.acted_on("apply") == []
    engine.calls.clear()
    reconciler.cycle()
    assert engine.calls == [("probe", ("a",))], "the new desired state was remembered"


def test_drift_and_desired_change_together_are_told_apart(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a")
    engine.nodes["a"].drift = drift("toolkit")
    engine.nodes["a"].variables = {"exporter_port": 9500}
    engine.nodes["a"].pending = {"toolkit": False, "exporter": False}
    report = reconciler.cycle()
    assert report.outcomes["a"].corrective == ["toolkit"]
    assert report.outcomes["a"].intentional == ["exporter"]


def test_check_only_plans_and_changes_nothing(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a")
    reconciler.settings.check_only = True
    engine.nodes["a"].drift = drift()
    engine.nodes["a"].pending = {"runtime_config": False}
    report = reconciler.cycle()
    assert engine.acted_on("apply") == []
    assert report.outcomes["a"].pending == ["runtime_config"]
    assert report.outcomes["a"].diffs["runtime_config"] == [
        "change runtime_config\n-old\n+new runtime_config"
    ]
    assert store.host("a").status == "drifted"


def test_components_filter_ignores_other_drift(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a")
    reconciler.settings.components = ("driver",)
    engine.nodes["a"].drift = drift("exporter")
    reconciler.cycle()
    assert engine.acted_on("plan") == []


def test_unreachable_host_backs_off_doubling_to_the_cap_and_others_go_on(
    store: StateStore,
) -> None:
    reconciler, engine, clock = converged(store, "a", "b")
    reconciler.settings.jitter = 0.0
    reconciler.settings.backoff_base = 60
    reconciler.settings.backoff_cap = 300
    reconciler.settings.quarantine_after = 100
    engine.nodes["a"].reachable = False
    engine.nodes["b"].drift = drift()
    engine.nodes["b"].pending = {"runtime_config": False}
    report = reconciler.cycle()
    assert report.outcomes["a"].action == "failed"
    assert engine.acted_on("apply") == ["b"], "the unreachable host did not stop the other"
    waits = []
    for _ in range(5):
        record = store.host("a")
        waits.append(record.next_attempt - clock.now)
        engine.calls.clear()
        reconciler.cycle()  # still backing off: not probed
        assert engine.acted_on("probe") == ["b"]
        clock.now = record.next_attempt
        reconciler.cycle()
    assert waits == [60, 120, 240, 300, 300]
    engine.nodes["a"].reachable = True
    clock.now = store.host("a").next_attempt
    reconciler.cycle()
    record = store.host("a")
    assert (record.status, record.consecutive_failures, record.next_attempt) == (
        "converged",
        0,
        None,
    )


def test_backoff_jitter_stays_in_bounds() -> None:
    settings = Settings(backoff_base=100, backoff_cap=10_000, jitter=0.2)
    rng = random.Random(1)
    delays = [backoff_delay(3, settings, rng) for _ in range(200)]
    assert min(delays) >= 320 and max(delays) <= 480
    assert len({round(d) for d in delays}) > 50, "jitter spreads the delays"


def test_a_node_lost_during_its_apply_is_unreachable_and_backs_off(store: StateStore) -> None:
    reconciler, engine, clock = converged(store, "a", "b")
    engine.nodes["a"].pending = {"exporter": False}
    engine.nodes["a"].drift = [{"component": "exporter", "kind": "service", "name": "x"}]

    apply = engine.converge

    def lost_while_applying(hosts: Sequence[str], check: bool, cluster: bool = False) -> RunResult:
        if not check:  # reachable for the probe, gone once the apply starts
            engine.nodes["a"].reachable = False
        return apply(hosts, check, cluster)

    engine.converge = lost_while_applying  # type: ignore[method-assign]
    reconciler.cycle()
    record = store.host("a")
    assert (record.status, record.failed_stage, record.consecutive_failures) == (
        "unreachable",
        "unreachable",
        1,
    )
    assert record.next_attempt is not None and record.next_attempt > clock.now
    assert store.host("b").status == "converged"


def test_quarantine_after_n_failures_until_released(store: StateStore) -> None:
    reconciler, engine, clock = converged(store, "a", "b")
    reconciler.settings.quarantine_after = 3
    engine.nodes["a"].broken_stage = "toolkit"
    engine.nodes["a"].drift = drift("toolkit")
    engine.nodes["a"].pending = {"toolkit": False}
    for _ in range(3):
        reconciler.cycle()
        clock.now = (store.host("a").next_attempt or clock.now) + 1
    record = store.host("a")
    assert record.quarantined
    assert (record.failed_stage, record.reason) == ("toolkit", "it broke")
    assert [e.kind for e in store.history("a", kinds=["quarantine"])] == ["quarantine"]
    engine.calls.clear()
    report = reconciler.cycle()
    assert engine.acted_on("probe") == ["b"]
    assert report.outcomes["a"].message == "quarantined"
    engine.nodes["a"].broken_stage = None
    release(store, "a", clock)
    reconciler.cycle()
    assert store.host("a").status == "converged"
    assert not store.host("a").quarantined


def test_a_stage_that_refuses_in_the_plan_fails_with_its_own_words(store: StateStore) -> None:
    """A stage that fails with nothing to change (slurm_gres on a node without
    slurmd) fails the host as an apply would: its reason in status, the cycle's
    report and history, backed off; not a bare `failed`."""
    from runner import show

    reconciler, engine, _ = converged(store, "a")
    engine.nodes["a"].variables["slurm_gres_manage"] = True  # a new desired state
    engine.nodes["a"].broken_stage = "slurm_gres"
    report = reconciler.cycle()
    assert engine.acted_on("apply") == [], "nothing to apply"
    record = store.host("a")
    assert (record.status, record.failed_stage, record.reason) == (
        "failed",
        "slurm_gres",
        "it broke",
    )
    assert show.host_line(record) == "failed (slurm_gres: it broke)"
    outcome = report.outcomes["a"]
    assert outcome.action == "failed"
    assert outcome.message.startswith("slurm_gres: it broke; next attempt in ")
    assert [(e.component, e.summary) for e in store.history("a", kinds=["failure"])] == [
        ("slurm_gres", "it broke")
    ]
    assert record.next_attempt is not None


def test_full_checks_fall_due_once_an_interval_each_host_at_its_own_time(
    store: StateStore,
) -> None:
    """Hosts onboarded together are fully checked once per interval, but not all in
    the same cycle: each at its own offset, the same one interval after interval, and
    none sooner than half an interval after its apply."""
    reconciler, engine, clock = converged(store, "a", "b", "c", "d")
    onboarded = clock.now
    reconciler.settings.full_check_interval = 3600
    checked: dict[str, list[float]] = {}
    for _ in range(3 * 3600 // 60):
        clock.now += 60
        engine.calls.clear()
        report = reconciler.cycle()
        for host in engine.acted_on("plan"):
            assert report.outcomes[host].reasons == ["full check due"]
            checked.setdefault(host, []).append(clock.now)
    assert engine.acted_on("apply") == [], "nothing to change, nothing applied"
    assert sorted(checked) == ["a", "b", "c", "d"]
    for times in checked.values():
        gaps = [b - a for a, b in itertools.pairwise([onboarded, *times])]
        assert all(1800 <= gap <= 5400 for gap in gaps), gaps
        assert gaps[-1] == 3600, "settled at its own offset: one interval apart"
    assert len({times[0] for times in checked.values()}) > 1, "not all in one cycle"


def test_loop_sleeps_the_jittered_interval_and_stops_on_request(store: StateStore) -> None:
    reconciler, engine, clock = converged(store, "a")
    reconciler.settings.interval = 100
    reconciler.settings.jitter = 0.1
    starts = []

    def probe_and_count(hosts: Sequence[str], cluster: bool = False) -> dict[str, ProbeResult]:
        starts.append(clock.now)
        if len(starts) == 4:
            reconciler.stop.request()
        return FakeEngine.probe(engine, hosts, cluster)

    engine.probe = probe_and_count  # type: ignore[method-assign]
    reconciler.run(once=False)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) == 4
    assert all(90 <= gap <= 110 for gap in gaps)
    assert len(set(gaps)) > 1, "the jitter differs from cycle to cycle"


def test_stop_during_a_batch_finishes_it_and_starts_no_other(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    upgrade_driver(engine, "a", "b")
    engine.on_apply = lambda hosts: reconciler.stop.request()
    report = reconciler.run(once=False)
    assert report.interrupted
    assert engine.acted_on("apply") == ["a"], "b's batch was not started"
    assert store.host("a").rollout_phase is None
    assert store.host("a").status == "converged"
    assert store.host("b").rollout_phase == "queued", "b waits, its phase persisted"


def applies(engine: FakeEngine) -> list[tuple[str, ...]]:
    return [hosts for call, hosts in engine.calls if call == "apply"]


def test_disruptive_changes_roll_one_batch_a_cycle(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a", "b", "c")
    reconciler.settings.max_parallel = reconciler.settings.max_unavailable = 2
    upgrade_driver(engine, "a", "b", "c")
    report = reconciler.cycle()
    assert applies(engine) == [("a", "b")]
    assert report.next_batch_at == report.finished, "no pause: the next cycle at once"
    assert report.rollouts == {"all": "2 done, 1 queued"}
    report = reconciler.cycle()
    assert applies(engine) == [("a", "b"), ("c",)]
    assert report.next_batch_at is None
    assert report.rollouts == {"all": "3 done; finished"}
    assert {r.rollout_phase for r in store.hosts().values()} == {None}
    phases = [e.component for e in store.history("a", kinds=["rollout"])]
    assert phases == ["queued", "applying", "applied", "done"]


def test_a_lost_state_database_never_lets_a_disruptive_change_skip_the_rollout(
    store: StateStore, tmp_path: Path
) -> None:
    """Nodes gpufleet converged before keep their own records; with the state database
    gone, a driver upgrade found on them is planned and rolled, not applied at once."""
    _, engine, _ = converged(store, "a", "b", "c")
    upgrade_driver(engine, "a", "b", "c")
    with StateStore(tmp_path / "state-rebuilt") as empty:
        reconciler, relearnt, _ = make(empty, engine.nodes)
        for _ in range(3):
            reconciler.cycle()
        calls = [call for call, _ in relearnt.calls]
        assert calls[:2] == ["probe", "plan"], "planned before anything is applied"
        assert applies(relearnt) == [("a",), ("b",), ("c",)], "one host a cycle (max_parallel 1)"
        assert calls.count("plan") == 1, "hosts in the rollout are not planned again"
        phases = [e.component for e in empty.history("b", kinds=["rollout"])]
        assert phases == ["queued", "applying", "applied", "done"]


def test_a_lost_state_database_is_relearnt_from_a_converged_fleet_without_changes(
    store: StateStore, tmp_path: Path
) -> None:
    _, engine, _ = converged(store, "a", "b")
    with StateStore(tmp_path / "state-rebuilt") as empty:
        reconciler, relearnt, _ = make(empty, engine.nodes)
        report = reconciler.cycle()
        assert [call for call, _ in relearnt.calls] == ["probe", "plan"]
        assert report.applied == 0
        assert {h.status for h in empty.hosts().values()} == {"converged"}
        relearnt.calls.clear()
        reconciler.cycle()
        assert relearnt.calls == [("probe", ("a", "b"))], "known again: only probed"


# What one cycle does to a Kubernetes node whose plan is disruptive.
K8S_ROLLOUT = ["probe", "plan", "cordon", "drain", "apply", "uncordon"]


def test_kubernetes_nodes_are_cordoned_drained_and_uncordoned(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a")
    upgrade_driver(engine, "a", k8s_manifests_apply=True)
    reconciler.cycle()
    assert [call for call, _ in engine.calls] == K8S_ROLLOUT


def test_the_record_keeps_the_nodes_os_and_the_driver_the_last_run_found(
    store: StateStore,
) -> None:
    reconciler, engine, _ = converged(store, "a")
    assert (store.host("a").os, store.host("a").driver_version) == ("debian 12", "535.261.03")
    upgrade_driver(engine, "a")
    reconciler.cycle()
    assert store.host("a").driver_version == "550.127.05", "the rollout's run read it again"


def test_a_mig_layout_change_is_rolled_out_like_a_driver_change(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a")
    engine.nodes["a"].variables = {"mig_config": "all-balanced", "k8s_manifests_apply": True}
    engine.nodes["a"].pending = {"mig": True}
    reconciler.cycle()
    assert [call for call, _ in engine.calls] == K8S_ROLLOUT
    assert store.host("a").mig_layout == "all-balanced"


def test_mig_drift_is_planned_first_and_rolled_out(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    engine.nodes["a"].drift = drift("mig")
    engine.nodes["a"].pending = {"mig": True}
    report = reconciler.cycle()
    assert [call for call, _ in engine.calls] == ["probe", "plan", "apply"]
    assert engine.acted_on("apply") == ["a"]
    assert report.outcomes["a"].corrective == ["mig"]
    phases = [e.component for e in store.history("a", kinds=["rollout"])]
    assert phases == ["queued", "applying", "applied", "done"]


def test_failing_host_halts_the_rollout_and_stays_cordoned(store: StateStore) -> None:
    reconciler, engine, clock = converged(store, "a", "b")
    upgrade_driver(engine, "a", "b", k8s_manifests_apply=True)
    engine.nodes["a"].broken_stage = "driver"
    reconciler.cycle()
    assert engine.acted_on("apply") == ["a"]
    assert "uncordon" not in [call for call, _ in engine.calls]
    record = store.host("a")
    assert record.rollout_phase == "halted"
    assert "it broke" in record.rollout_reason
    assert store.host("b").rollout_phase == "queued"
    engine.calls.clear()
    clock.now += 10_000
    report = reconciler.cycle()
    assert engine.acted_on("apply") == [], "the halted rollout does not go on by itself"
    assert engine.acted_on("plan") == [], "nor is the halted host planned again"
    assert report.outcomes["a"].message.startswith("rollout halted: ")


def test_restarted_reconciler_resumes_a_drained_host_first(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    upgrade_driver(engine, "a", "b", k8s_manifests_apply=True)
    # A reconciler stopped after draining b: b is out of service, a still queued.
    for host, phase in (("a", "queued"), ("b", "drained")):
        record = store.host(host)
        record.rollout_phase = phase
        store.save(record)
    reconciler.cycle()
    reconciler.cycle()
    assert applies(engine) == [("b",), ("a",)]
    assert ("drain", ("b",)) not in engine.calls, "b was not drained twice"


def test_excluded_host_gets_no_disruptive_change(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a")
    upgrade_driver(engine, "a", gpufleet_rollout_exclude=True)
    reconciler.cycle()
    assert engine.acted_on("apply") == []
    assert store.host("a").status == "excluded"


def test_hosts_gone_from_the_inventory_are_forgotten(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    del engine.nodes["b"]
    reconciler.cycle()
    assert list(store.hosts()) == ["a"]


def test_a_host_outside_the_managed_pattern_keeps_its_record(store: StateStore) -> None:
    """--hosts naming fewer hosts (or GPUFLEET_HOSTS differing between two runs) must not
    erase what the state knows of the others: a rollout, a quarantine, a cordon."""
    reconciler, engine, _ = converged(store, "a", "b")
    everything = engine.inventory
    engine.inventory = lambda limit=None: {  # type: ignore[method-assign]
        h: v for h, v in everything(limit).items() if h == "a"
    }
    report = reconciler.cycle()
    assert list(report.outcomes) == ["a"]
    assert sorted(store.hosts()) == ["a", "b"]


def test_stop_object_second_request_is_urgent() -> None:
    stop = Stop()
    stop.request()
    assert (stop.requested, stop.urgent) == (True, False)
    stop.request()
    assert stop.urgent


def test_metrics_follow_the_loop(store: StateStore) -> None:
    from prometheus_client import generate_latest

    from runner.metrics import Metrics

    metrics = Metrics()
    # From the start, before any cycle: what absence and staleness alerts read.
    before = generate_latest(metrics.registry).decode()
    assert f'gpufleet_build_info{{version="{__version__}"}} 1.0' in before
    assert "gpufleet_reconcile_last_cycle_timestamp_seconds " in before
    reconciler, engine, _ = converged(store, "a", "b")
    reconciler.observe = Observers([metrics])
    engine.nodes["b"].drift = drift()
    engine.nodes["b"].pending = {"runtime_config": False}
    report = reconciler.cycle()
    assert metrics.last_cycle._value.get() == report.finished
    text = generate_latest(metrics.registry).decode()
    for line in (
        'gpufleet_reconcile_cycles_total{result="ok"} 1.0',
        'gpufleet_reconcile_hosts_total{phase="probe"} 2.0',
        'gpufleet_reconcile_hosts_total{phase="plan"} 1.0',
        'gpufleet_reconcile_hosts_total{phase="apply"} 1.0',
        'gpufleet_drift_detected_total{component="runtime_config",kind="file"} 1.0',
        'gpufleet_changes_total{component="runtime_config",host="b",kind="corrective"} 1.0',
        'gpu_operator_node_driver_ready{node="b"} 1.0',
        'gpufleet_host_status{host="b",status="converged"} 1.0',
        'gpufleet_host_stage_status{host="b",stage="driver",status="ready"} 1.0',
        "gpufleet_reconcile_cycle_duration_seconds_count 1.0",
    ):
        assert line in text


def test_node_ready_gauges_count_only_the_stages_that_are_on() -> None:
    from prometheus_client import generate_latest

    from runner.metrics import Metrics
    from runner.observe import HostUpdated
    from runner.state import HostRecord, HostStatus

    metrics = Metrics()
    stages = {s: "ready" for s in STAGES} | {
        "runtime_config": "disabled",
        "device_plugin": "disabled",
    }
    metrics.host_updated(
        HostUpdated.of(HostRecord("a", status=HostStatus.CONVERGED, stages=stages))
    )
    failed = stages | {"toolkit": "failed"}
    metrics.host_updated(HostUpdated.of(HostRecord("b", status=HostStatus.FAILED, stages=failed)))
    metrics.host_updated(
        HostUpdated.of(
            HostRecord(
                "c",
                status=HostStatus.NOT_A_GPU_NODE,
                stages=dict.fromkeys(STAGES, "not-a-gpu-node"),
            )
        )
    )
    text = generate_latest(metrics.registry).decode()
    assert 'gpu_operator_node_toolkit_ready{node="a"} 1.0' in text  # runtime_config off
    assert 'gpu_operator_node_toolkit_ready{node="b"} 0.0' in text
    assert 'gpu_operator_node_plugin_ready{node="a"}' not in text  # device plugin off
    assert 'node="c"' not in text  # no GPUs: no series


def test_metrics_of_a_host_gone_from_the_inventory_are_dropped(store: StateStore) -> None:
    from prometheus_client import generate_latest

    from runner.metrics import Metrics

    metrics = Metrics()
    reconciler, engine, _ = converged(store, "a", "b")
    reconciler.observe = Observers([metrics])
    engine.nodes["b"].drift = drift()
    reconciler.cycle()
    assert 'host="b"' in generate_latest(metrics.registry).decode()
    del engine.nodes["b"]
    reconciler.cycle()
    text = generate_latest(metrics.registry).decode()
    assert 'host="b"' not in text and 'node="b"' not in text
    assert 'gpufleet_host_status{host="a",status="converged"} 1.0' in text


def test_a_node_waiting_for_a_reboot_backs_off_but_is_never_quarantined(
    store: StateStore,
) -> None:
    nodes = fresh_fleet("a")
    nodes["a"].needs_reboot = True
    reconciler, engine, clock = make(store, nodes, quarantine_after=2)
    waits = []
    for _ in range(4):
        reconciler.cycle()
        record = store.host("a")
        waits.append((record.next_attempt or clock.now) - clock.now)
        clock.now = (record.next_attempt or clock.now) + 1
    assert (record.status, record.failed_stage, record.reason) == (
        "reboot-required",
        "driver",
        "reboot the node",
    )
    assert not record.quarantined
    assert waits == sorted(waits) and waits[-1] > waits[0], "each retry waits longer"
    engine.nodes["a"].needs_reboot = False  # the operator rebooted it
    reconciler.cycle()
    assert store.host("a").status == "converged"


# -- the cluster side -------------------------------------------------------------


def cluster_fleet(store: StateStore, *names: str) -> tuple[Reconciler, FakeEngine, FakeClock]:
    """A converged fleet whose inventory applies the cluster side."""
    nodes = {n: Node(variables={"k8s_manifests_apply": True}) for n in names}
    reconciler, engine, clock = make(store, nodes)
    engine.cluster.recorded = False
    reconciler.cycle()
    engine.calls.clear()
    engine.cluster_runs.clear()
    return reconciler, engine, clock


def test_first_cycle_applies_the_cluster_side_once_with_the_hosts(store: StateStore) -> None:
    nodes = {
        n: Node(pending={"driver": False}, variables={"k8s_manifests_apply": True}) for n in "ab"
    }
    reconciler, engine, _ = make(store, nodes)
    engine.cluster.recorded = False
    report = reconciler.cycle()
    assert engine.cluster_runs == [("probe", ("a", "b")), ("apply", ("a", "b"))]
    assert store.cluster().status == "converged"
    assert report.cluster.startswith("applied")


def test_steady_state_reads_the_cluster_once_and_applies_nothing(store: StateStore) -> None:
    reconciler, engine, _ = cluster_fleet(store, "a", "b")
    reconciler.cycle()
    assert engine.calls == [("probe", ("a", "b"))]
    assert engine.cluster_runs == [("probe", ("a", "b"))]


def test_a_label_removed_by_hand_is_restored_by_applying_that_host_only(
    store: StateStore,
) -> None:
    reconciler, engine, _ = cluster_fleet(store, "a", "b")
    engine.cluster.drift = [label_drift("a")]
    report = reconciler.cycle()
    assert engine.calls == [("probe", ("a", "b")), ("apply", ("a",))]
    assert engine.cluster_runs[-1] == ("apply", ("a",))
    assert report.outcomes["a"].corrective == ["cluster"]
    assert report.outcomes["a"].reasons == ["cluster drift"]
    assert [(e.kind, e.component) for e in store.history("a")][-2:] == [
        ("drift", "cluster"),
        ("corrective", "cluster"),
    ]
    assert "nvidia.com/gpu.present true -> None" in store.history("a")[-2].summary
    assert engine.cluster.drift == []
    reconciler.cycle()
    assert engine.calls[-1] == ("probe", ("a", "b")), "repaired: the next cycle only probes"


def test_a_deleted_object_is_reapplied_without_any_node(store: StateStore) -> None:
    reconciler, engine, _ = cluster_fleet(store, "a")
    engine.cluster.drift = [
        {
            "component": "cluster",
            "kind": "DaemonSet",
            "name": "nvidia-device-plugin",
            "host": None,
            "recorded": "recorded",
            "current": None,
        }
    ]
    report = reconciler.cycle()
    assert engine.calls == [("probe", ("a",)), ("apply", ())]
    assert report.cluster.startswith("repaired")
    assert [e.kind for e in store.history("(cluster)")][-2:] == ["drift", "corrective"]


def test_check_mode_reports_cluster_drift_and_applies_nothing(store: StateStore) -> None:
    reconciler, engine, _ = cluster_fleet(store, "a")
    reconciler.settings.check_only = True
    engine.cluster.drift = [label_drift("a")]
    report = reconciler.cycle()
    assert [c for c, _ in engine.calls] == ["probe"]
    assert report.cluster_pending
    assert "would apply the cluster side (labels of a)" in report.cluster


def test_api_server_gone_node_work_goes_on_and_the_next_cycle_finishes_it(
    store: StateStore,
) -> None:
    reconciler, engine, _ = cluster_fleet(store, "a", "b")
    engine.nodes["a"].drift = [{"component": "exporter", "kind": "service", "name": "x"}]
    engine.nodes["a"].pending = {"exporter": False}
    engine.cluster.api_up = False
    report = reconciler.cycle()
    # The probe could not read the cluster: the node's own drift is repaired anyway.
    assert report.outcomes["a"].corrective == ["exporter"]
    assert store.host("a").status == "converged"
    assert report.cluster_failed and "connection refused" in report.cluster
    # The apply that included the cluster side failed there: the labels of the
    # host it applied are owed.
    cluster = store.cluster()
    assert (cluster.status, cluster.owed_hosts, cluster.owed_objects) == ("failed", ["a"], True)
    engine.cluster.api_up = True
    engine.calls.clear()
    report = reconciler.cycle()
    assert engine.calls == [("probe", ("a", "b")), ("apply", ("a",))]
    assert report.outcomes["a"].reasons == ["cluster side owed"]
    cluster = store.cluster()
    assert (cluster.status, cluster.owed_hosts, cluster.owed_objects) == ("converged", [], False)


def test_a_drain_blocked_by_a_budget_waits_cordoned_and_resumes_when_it_allows(
    store: StateStore,
) -> None:
    reconciler, engine, _ = converged(store, "a")
    upgrade_driver(engine, "a", k8s_manifests_apply=True)
    engine.budget_blocks.add("a")
    report = reconciler.cycle()
    assert [c for c, _ in engine.calls] == ["probe", "plan", "cordon", "drain"]
    record = store.host("a")
    assert record.rollout_phase == "cordoned", "not halted: no release is needed"
    assert "PodDisruptionBudget ml/train allows no disruption" in record.rollout_reason
    assert "pod ml/train-0" in report.outcomes["a"].message
    assert "a" in engine.cordoned
    blocked = [e for e in store.history("a", kinds=["rollout"]) if e.component == "drain-blocked"]
    assert "ml/train-0" in blocked[-1].summary
    # The budget allows it now: the next cycle drains, applies and uncordons (no
    # plan: the host's change was planned when it joined the rollout).
    engine.budget_blocks.clear()
    engine.calls.clear()
    reconciler.cycle()
    assert [c for c, _ in engine.calls] == ["probe", "drain", "apply", "uncordon"]
    assert store.host("a").rollout_phase is None
    assert "a" not in engine.cordoned


def test_a_node_cordoned_before_the_rollout_stays_cordoned_after(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a")
    upgrade_driver(engine, "a", k8s_manifests_apply=True)
    engine.cordoned.add("a")  # an admin's cordon
    reconciler.cycle()
    assert [c for c, _ in engine.calls] == ["probe", "plan", "cordon", "drain", "apply"]
    assert "a" in engine.cordoned
    record = store.host("a")
    assert (record.rollout_phase, record.keep_cordoned) == (None, False)
    done = store.history("a", kinds=["rollout"])[-1]
    assert done.summary == "done; left cordoned as it was before"


def test_a_host_whose_stage_fails_is_relabelled_in_the_same_apply(store: StateStore) -> None:
    """Its Node's deploy labels follow the stage outcomes of that apply (the
    k8s_manifests filter's unit tests: a failed stage gives `false`)."""
    reconciler, engine, _ = cluster_fleet(store, "a", "b")
    engine.nodes["a"].drift = [{"component": "toolkit", "kind": "package", "name": "x"}]
    engine.nodes["a"].broken_stage = "toolkit"
    reconciler.cycle()
    assert engine.cluster_runs[-1] == ("apply", ("a",))
    assert store.host("a").status == "failed"
    assert store.cluster().status == "converged"


# -- rollouts across cycles ---------------------------------------------------------


def exporter_drift() -> list[dict[str, Any]]:
    return [{"component": "exporter", "kind": "service", "name": "dcgm-exporter.service"}]


def test_drift_elsewhere_is_repaired_while_a_rollout_goes_on_a_batch_a_cycle(
    store: StateStore,
) -> None:
    """Three hosts get a new driver one at a time; drift on a fourth, injected during
    the first batch, is repaired before the second batch (and the rollout's cycles
    follow each other without waiting an interval)."""
    reconciler, engine, clock = converged(store, "a", "b", "c", "d")
    reconciler.settings.interval = 300
    upgrade_driver(engine, "a", "b", "c")

    def applying(hosts: Sequence[str]) -> None:
        clock.now += 120  # an apply takes two minutes
        if list(hosts) == ["a"]:
            engine.nodes["d"].drift = exporter_drift()
            engine.nodes["d"].pending = {"exporter": False}
        if "c" in hosts:
            reconciler.stop.request()

    engine.on_apply = applying
    start = clock.now
    reconciler.run(once=False)
    assert applies(engine) == [("a",), ("d",), ("b",), ("c",)]
    repaired = [e.at for e in store.history("d") if e.kind == "corrective"]
    finished = [e.at for e in store.history("c", kinds=["rollout"]) if e.component == "done"]
    assert repaired and finished and repaired[0] < finished[0]
    assert finished[0] - start == 4 * 120, "no interval slept between the rollout's cycles"
    rollout = store.rollouts()["all"]
    assert (rollout.done, rollout.finished) == (["a", "b", "c"], finished[0])


def test_sigterm_between_batches_and_a_restarted_reconciler_resumes_the_rollout(
    store: StateStore,
) -> None:
    reconciler, engine, clock = converged(store, "a", "b", "c")
    upgrade_driver(engine, "a", "b", "c")
    engine.on_apply = lambda hosts: reconciler.stop.request()
    report = reconciler.run(once=False)
    assert report.interrupted
    assert applies(engine) == [("a",)]
    assert [store.host(h).rollout_phase for h in "abc"] == [None, "queued", "queued"]
    restarted, again, _ = make(store, engine.nodes, clock=clock)
    again.on_apply = lambda hosts: "c" in hosts and restarted.stop.request()
    restarted.run(once=False)
    assert applies(again) == [("b",), ("c",)]
    assert again.acted_on("plan") == [], "the queued hosts' plans were kept"
    assert store.rollouts()["all"].done == ["a", "b", "c"]
    assert {store.host(h).status for h in "abc"} == {"converged"}


def test_pools_roll_side_by_side_each_by_its_own_policy(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "t1", "t2", "t3", "i1", "i2")
    train = {
        "gpufleet_rollout_pool": "train",
        "gpufleet_rollout_max_parallel": 2,
        "gpufleet_rollout_max_unavailable": 2,
    }
    upgrade_driver(engine, "t1", "t2", "t3", **train)
    upgrade_driver(engine, "i1", "i2", gpufleet_rollout_pool="infer")
    report = reconciler.cycle()
    assert applies(engine) == [("i1",), ("t1", "t2")]
    assert report.rollouts == {"infer": "1 done, 1 queued", "train": "2 done, 1 queued"}
    reconciler.cycle()
    assert applies(engine)[2:] == [("i2",), ("t3",)]
    assert {p: r.done for p, r in store.rollouts().items()} == {
        "infer": ["i1", "i2"],
        "train": ["t1", "t2", "t3"],
    }


def test_a_pool_goes_on_past_a_failure_until_its_threshold(store: StateStore) -> None:
    reconciler, engine, clock = converged(store, "a", "b", "c", "d")
    policy = {"gpufleet_rollout_max_unavailable": 3, "gpufleet_rollout_max_failures": 2}
    upgrade_driver(engine, "a", "b", "c", "d", **policy)
    engine.nodes["a"].broken_stage = engine.nodes["b"].broken_stage = "driver"
    for _ in range(3):
        report = reconciler.cycle()
        clock.now += 10_000  # past every backoff: halted hosts are not retried either
    assert applies(engine) == [("a",), ("b",)], "one failure let b go; two halt the pool"
    assert [store.host(h).rollout_phase for h in "abcd"] == ["halted", "halted", "queued", "queued"]
    assert report.outcomes["c"].message == "rollout halted by a, b; release the host(s) to go on"
    assert report.rollouts["all"] == "0 done, 2 queued, 2 halted; halted by a, b; release the " + (
        "host(s) to go on"
    )


def test_a_pool_pauses_between_batches_and_the_loop_wakes_for_the_next(
    store: StateStore,
) -> None:
    reconciler, engine, clock = converged(store, "a", "b")
    upgrade_driver(engine, "a", "b", gpufleet_rollout_pause=600)
    report = reconciler.cycle()
    assert applies(engine) == [("a",)]
    assert report.next_batch_at == clock.now + 600
    clock.now += 300
    report = reconciler.cycle()
    assert applies(engine) == [("a",)]
    assert report.outcomes["b"].message == "rollout pauses between batches; the next in 300 s"
    reconciler.settings.interval = 3600
    engine.on_apply = lambda hosts: reconciler.stop.request()
    start = clock.now
    reconciler.run(once=False)
    assert applies(engine) == [("a",), ("b",)]
    assert clock.now - start == pytest.approx(300), "woke for the batch, not after an interval"


def test_a_queued_host_with_nothing_left_to_change_leaves_the_rollout(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    upgrade_driver(engine, "a", "b")
    reconciler.cycle()
    # b's new driver was installed by other means; asked for again it is planned.
    engine.nodes["b"].variables["driver_version"] = "550.163.01"
    engine.nodes["b"].pending = {}
    reconciler.cycle()
    assert applies(engine) == [("a",)]
    assert store.host("b").rollout_phase is None
    summary = store.history("b", kinds=["rollout"])[-1].summary
    assert summary == "left the rollout: nothing to change any more"


@pytest.mark.parametrize(
    ("variables", "words"),
    [
        (
            {"b": {"gpufleet_rollout_max_parallel": "two"}},
            "gpufleet_rollout_max_parallel on host b: expected a positive integer, got 'two'",
        ),
        (
            {"b": {"gpufleet_rollout_pause": -1}},
            "gpufleet_rollout_pause on host b: expected seconds, a number >= 0, got -1",
        ),
        (
            {"a": {"gpufleet_rollout_max_failures": 1}, "b": {"gpufleet_rollout_max_failures": 3}},
            "gpufleet_rollout_max_failures: hosts of rollout pool 'all' disagree (a has 1, b "
            "has 3); expected one value per pool",
        ),
        (
            {"a": {"gpufleet_rollout_max_parallel": 2}},
            "gpufleet_rollout_max_parallel 2 exceeds gpufleet_rollout_max_unavailable 1 in "
            "rollout pool 'all': a batch could never start",
        ),
    ],
)
def test_a_wrong_rollout_variable_stops_the_cycle_before_any_host_is_touched(
    store: StateStore, variables: dict[str, dict[str, Any]], words: str
) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    for host, values in variables.items():
        engine.nodes[host].variables = values
    with pytest.raises(PolicyError) as error:
        reconciler.cycle()
    assert str(error.value).startswith(words)
    assert engine.calls == [], "not even probed"


class Reports(Observer):
    """Keeps every cycle's report."""

    def __init__(self) -> None:
        self.reports: list[CycleReport] = []

    def cycle_finished(self, report: CycleReport) -> None:
        self.reports.append(report)


def in_the_loop(
    store: StateStore, engine: FakeEngine, clock: FakeClock
) -> tuple[Reconciler, list[CycleReport]]:
    """The fleet under the long-running loop, whose batches apply in the background (a
    thread, as in `reconcile`); on fake time still, slept in short real steps so that
    the loop does not spin while a batch's thread works. Returns the reports of its
    cycles as they finish."""
    reports = Reports()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        time.sleep(0.001)

    reconciler = Reconciler(
        engine,
        store,
        Settings(interval=300),
        clock=clock,
        sleep=sleep,
        rng=random.Random(7),
        observers=[reports],
        background=True,
    )
    return reconciler, reports.reports


def test_in_the_loop_a_batch_applies_in_the_background_and_drift_elsewhere_is_repaired_meanwhile(
    store: StateStore,
) -> None:
    """a's new driver takes long to apply; the exporter of d drifts in the meantime
    and the next cycle, while a's batch still applies, repairs it; a is left alone
    until its batch ends, then uncordoned and done, and b's batch follows."""
    _, engine, clock = converged(store, "a", "b", "c", "d")
    reconciler, reports = in_the_loop(store, engine, clock)
    upgrade_driver(engine, "a", "b")
    d_repaired = threading.Event()
    phase_of_a: list[str | None] = []

    def applying(hosts: Sequence[str]) -> None:
        if list(hosts) == ["a"]:  # in the batch's thread
            engine.nodes["d"].drift = exporter_drift()
            engine.nodes["d"].pending = {"exporter": False}
            assert d_repaired.wait(10), "d was not repaired while a's batch applied"
        elif list(hosts) == ["d"]:
            phase_of_a.append(store.host("a").rollout_phase)
            d_repaired.set()
        elif list(hosts) == ["b"]:
            reconciler.stop.request()

    engine.on_apply = applying
    last = reconciler.run(once=False)
    assert applies(engine) == [("a",), ("d",), ("b",)]
    assert phase_of_a == ["applying"]
    repairing = next(r for r in reports if r.outcomes["d"].corrective == ["exporter"])
    assert repairing.outcomes["a"].action == "skipped"
    assert repairing.outcomes["a"].message.startswith("rollout: its change applying")
    assert repairing.outcomes["b"].message == "rollout waits for its batch applying (a)"
    a_phases = {e.component: e.at for e in store.history("a", kinds=["rollout"])}
    repaired = [e.at for e in store.history("d") if e.kind == "corrective"]
    assert a_phases["applying"] < repaired[0] <= a_phases["done"]
    # The stop came during b's batch: the loop waited for it and finished it.
    assert last.interrupted
    assert last.outcomes["b"].action == "rolled-out"
    assert [store.host(h).rollout_phase for h in "ab"] == [None, None]
    rollout = store.rollouts()["all"]
    assert rollout.done == ["a", "b"] and rollout.finished is not None
    assert {store.host(h).status for h in "abcd"} == {"converged"}


def test_a_pool_waits_for_its_batch_applying_and_once_waits_for_it_to_end(
    store: StateStore,
) -> None:
    _, engine, clock = converged(store, "a", "b")
    reconciler, _ = in_the_loop(store, engine, clock)
    upgrade_driver(engine, "a", "b")
    gate = threading.Event()
    engine.on_apply = lambda hosts: gate.wait(10)
    reconciler.settings.max_unavailable = 2  # room for b, but a's batch is under way
    try:
        first = reconciler.cycle()
        second = reconciler.cycle()
    finally:
        gate.set()
    assert first.rollouts == {"all": "0 done, 1 in flight, 1 queued"}
    assert second.outcomes["b"].message == "rollout waits for its batch applying (a)"
    assert applies(engine) == [("a",)]
    last = reconciler.run(once=True)
    assert last.outcomes["a"].action == "rolled-out"
    assert store.host("a").rollout_phase is None, "a's batch finished before run() returned"


def test_a_host_left_applying_by_a_killed_reconciler_is_the_next_batch(
    store: StateStore,
) -> None:
    reconciler, engine, _ = converged(store, "a", "b", "c")
    upgrade_driver(engine, "a", "b", "c")
    reconciler.cycle()
    killed = store.host("c")
    killed.rollout_phase = "applying"
    store.save(killed)
    reconciler.cycle()
    assert applies(engine) == [("a",), ("c",)], "out of service already: c before b"
    assert store.host("c").rollout_phase is None
    assert store.host("b").rollout_phase == "queued"


def test_labels_changing_under_a_batch_applying_are_not_cluster_drift(store: StateStore) -> None:
    """The batch's apply relabels its Node (a new driver version): a cycle meanwhile
    that reads the labels half-way is not to take them for drift and repair them."""
    _, engine, clock = cluster_fleet(store, "a", "b")
    reconciler, _ = in_the_loop(store, engine, clock)
    upgrade_driver(engine, "a", k8s_manifests_apply=True)
    gate = threading.Event()
    engine.on_apply = lambda hosts: gate.wait(10)
    try:
        reconciler.cycle()
        engine.cluster.drift = [label_drift("a")]
        during = reconciler.cycle()
    finally:
        gate.set()
    assert during.cluster == "converged"
    assert store.cluster().drift == []
    assert applies(engine) == [("a",)], "nothing applied to repair a's labels"
    assert [e for e in store.history("a") if e.kind == "drift"] == []


# --- Slurm around a rollout -----------------------------------------------------------


def slurm_node(engine: FakeEngine, host: str, jobs: Sequence[str] = (), drained: str = "") -> None:
    """`host` runs slurmd, with `jobs` running and, if given, drained for that reason."""
    engine.slurm_nodes.add(host)
    engine.slurm_jobs[host] = list(jobs)
    if drained:
        engine.slurm_drained[host] = drained


def test_a_slurm_node_is_drained_and_its_jobs_end_before_its_change(store: StateStore) -> None:
    reconciler, engine, clock = converged(store, "a")
    upgrade_driver(engine, "a")
    slurm_node(engine, "a", jobs=["41", "42"])
    report = reconciler.cycle()
    assert engine.acted_on("apply") == [], "the driver is not touched while jobs run"
    assert engine.slurm_drained["a"].startswith("gpufleet: ")
    record = store.host("a")
    assert (record.rollout_phase, record.slurm_drained) == ("cordoned", "gpufleet")
    assert record.slurm_state == "IDLE+DRAIN"
    assert "Slurm job(s) 41, 42 still running" in record.rollout_reason
    assert "Slurm job(s) 41, 42 still running" in report.outcomes["a"].message
    # The jobs end; a reconciler started afresh goes on from the stored phase.
    engine.slurm_jobs["a"] = []
    clock.sleep(30)
    engine.calls.clear()
    restarted = Reconciler(engine, store, Settings(), clock=clock, sleep=clock.sleep)
    restarted.cycle()
    assert [c for c, _ in engine.calls] == ["probe", "apply"]
    assert engine.slurm_calls[-2:] == [("drain", ("a",)), ("resume", ("a",))]
    assert "a" not in engine.slurm_drained, "resumed"
    record = store.host("a")
    assert (record.rollout_phase, record.slurm_drained, record.slurm_state) == (None, "", "IDLE")
    phases = [e.component for e in store.history("a", kinds=["rollout"])]
    assert phases == ["queued", "cordoned", "drained", "applying", "applied", "done"]


def halted_on_a_job(store: StateStore) -> tuple[Reconciler, FakeEngine, FakeClock]:
    """Host a's driver change halted: job 77 outlasted its slurm_drain_timeout (60 s)."""
    reconciler, engine, clock = converged(store, "a")
    upgrade_driver(engine, "a", slurm_drain_timeout=60)
    slurm_node(engine, "a", jobs=["77"])
    reconciler.cycle()
    clock.sleep(61)
    reconciler.cycle()
    return reconciler, engine, clock


def test_jobs_past_the_bound_halt_the_rollout_naming_them(store: StateStore) -> None:
    _, engine, _ = halted_on_a_job(store)
    record = store.host("a")
    assert record.rollout_phase == "halted"
    assert "Slurm job(s) 77 still running after 60 s" in record.rollout_reason
    assert engine.acted_on("apply") == []
    assert engine.slurm_drained["a"].startswith("gpufleet: "), "left drained, as a halt is"


def test_an_administrators_drain_is_kept_after_the_change(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a")
    upgrade_driver(engine, "a")
    slurm_node(engine, "a", drained="disk check")
    reconciler.cycle()
    assert engine.acted_on("apply") == ["a"]
    assert engine.slurm_drained["a"] == "disk check", "never resumed by gpufleet"
    done = store.history("a", kinds=["rollout"])[-1]
    assert done.summary == "done; left drained in Slurm as an administrator had it (disk check)"


def test_slurm_drain_false_or_no_slurmd_leaves_slurm_alone(store: StateStore) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    upgrade_driver(engine, "a", slurm_drain=False)
    upgrade_driver(engine, "b")  # auto, and no slurmd on b
    slurm_node(engine, "a", jobs=["9"])
    reconciler.cycle()
    reconciler.cycle()
    assert sorted(engine.acted_on("apply")) == ["a", "b"]
    assert [hosts for _, hosts in engine.slurm_calls] == [("b",)], "false: not even asked"
    assert engine.slurm_drained == {}


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"slurm_drain": "yes"}, "slurm_drain on host a: expected auto, true or false, got 'yes'"),
        (
            {"slurm_drain_timeout": -1},
            "slurm_drain_timeout on host a: expected seconds, a number > 0, got -1",
        ),
        (
            {"gpufleet_health_out_of_service": "drain"},
            "gpufleet_health_out_of_service on host a: expected cordon or taint, got 'drain'",
        ),
    ],
)
def test_a_wrong_out_of_service_setting_stops_the_cycle_before_any_host(
    store: StateStore, variables: dict[str, Any], message: str
) -> None:
    reconciler, engine, _ = converged(store, "a")
    upgrade_driver(engine, "a", **variables)
    with pytest.raises(PolicyError, match=message):
        reconciler.cycle()
    assert engine.calls == []


def test_a_node_an_administrator_resumes_while_jobs_run_is_gpufleets_to_resume(
    store: StateStore,
) -> None:
    reconciler, engine, _ = converged(store, "a")
    upgrade_driver(engine, "a")
    slurm_node(engine, "a", jobs=["5"], drained="disk check")
    reconciler.cycle()
    record = store.host("a")
    assert (record.slurm_drained, record.slurm_admin_reason) == ("admin", "disk check")
    del engine.slurm_drained["a"]  # the administrator resumes it; the job still runs
    reconciler.cycle()
    assert engine.slurm_drained["a"].startswith("gpufleet: "), "drained again, by gpufleet"
    engine.slurm_jobs["a"] = []
    reconciler.cycle()
    assert engine.acted_on("apply") == ["a"]
    assert "a" not in engine.slurm_drained, "resumed: the drain was gpufleet's"
    assert store.history("a", kinds=["rollout"])[-1].summary == "done"


def test_a_released_host_with_nothing_left_to_change_is_resumed_in_slurm(
    store: StateStore,
) -> None:
    reconciler, engine, clock = halted_on_a_job(store)
    assert store.host("a").rollout_phase == "halted"
    # The operator puts the old driver back and releases the host.
    engine.nodes["a"].variables = {"slurm_drain_timeout": 60}
    engine.nodes["a"].pending = {}
    release(store, "a", clock)
    reconciler.cycle()
    record = store.host("a")
    assert (record.rollout_phase, record.slurm_drained) == (None, "")
    assert "a" not in engine.slurm_drained
    left = store.history("a", kinds=["rollout"])[-1].summary
    assert left == "left the rollout: nothing to change any more; resumed in Slurm"
