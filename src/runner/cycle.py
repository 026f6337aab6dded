# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a cycle works with: the reconciler's settings and collaborators, one cycle's
working memory, and the report it leaves.

`Context` is what lasts across cycles (the engine, the state writer, time, the
batches applying in the background); `Cycle` is one cycle's working memory, handed
from phase to phase; `CycleReport` is what the cycle tells its caller (and what
`reconcile --once --json` prints).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from runner.engine import Engine, ProbeResult, RunResult
from runner.rollout import RolloutPolicy
from runner.state import HostRecord

if TYPE_CHECKING:
    from runner.observe import Observers
    from runner.writer import Writer


@dataclass
class Settings:
    interval: float = 300.0
    # Each sleep is the interval times a random factor in [1 - jitter, 1 + jitter], so
    # reconcilers started together do not stay in step.
    jitter: float = 0.1
    backoff_base: float = 60.0
    backoff_cap: float = 3600.0
    quarantine_after: int = 5
    # A host's whole playbook is planned once per this interval even if nothing
    # drifted (what the probe cannot see: a package a role installs but does not
    # record), each host at its own offset in it.
    full_check_interval: float = 86400.0
    # The rollout policy of pools whose inventory sets none.
    max_parallel: int = 1
    max_unavailable: int = 1
    check_only: bool = False
    limit: str | None = None
    # Only drift in and changes to these components lead to action (all when empty).
    components: tuple[str, ...] = ()
    # GPU health: hosts asking a reset or a reboot at once at which automatic
    # remediation stops (0: never), and how long after a remediation a GPU asking
    # again is quarantined instead.
    health_breaker: int = 3
    health_window: float = 86400.0

    @property
    def default_policy(self) -> RolloutPolicy:
        return RolloutPolicy(self.max_parallel, self.max_unavailable)


class Stop:
    """Set by a signal handler: `requested` ends the loop after the current batch,
    `urgent` (a second signal) cancels the running Ansible run too."""

    def __init__(self) -> None:
        self.requested = False
        self.urgent = False

    def request(self) -> None:
        self.urgent = self.requested
        self.requested = True


class Action(StrEnum):
    """What a cycle did with a host (HostOutcome.action)."""

    PROBED = "probed"
    PLANNED = "planned"
    APPLIED = "applied"
    ROLLED_OUT = "rolled-out"
    SKIPPED = "skipped"
    FAILED = "failed"
    # Waits for something outside gpufleet (a reboot).
    WAITING = "waiting"


@dataclass
class HostOutcome:
    host: str
    action: Action
    reasons: list[str] = field(default_factory=list)
    corrective: list[str] = field(default_factory=list)
    intentional: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    # The pending change disrupts the node's workloads: it goes through a rollout.
    disruptive: bool = False
    diffs: dict[str, list[str]] = field(default_factory=dict)
    message: str = ""


@dataclass
class CycleReport:
    started: float
    finished: float = 0.0
    outcomes: dict[str, HostOutcome] = field(default_factory=dict)
    probed: int = 0
    planned: int = 0
    applied: int = 0
    interrupted: bool = False
    # The cluster side this cycle, in words ("" when the inventory has none).
    cluster: str = ""
    # The cluster side has drift or owed work this cycle did not apply (check mode).
    cluster_pending: bool = False
    cluster_failed: bool = False
    # Pool -> where its rollout stands after this cycle, in words.
    rollouts: dict[str, str] = field(default_factory=dict)
    # Why automatic GPU remediation is held this cycle (the circuit breaker), in
    # words; "" when it is not.
    health_held: str = ""
    # When the next batch of a rollout may start (the loop's next cycle starts then
    # rather than a whole interval later); None when no rollout has one to go.
    next_batch_at: float | None = None

    def hosts_with(self, action: str) -> list[str]:
        return sorted(h for h, o in self.outcomes.items() if o.action == action)

    def say(self, host: str, message: str) -> None:
        """Set what the report says of a host that already has an outcome."""
        self.outcomes[host].message = message

    def batch_due(self, at: float) -> None:
        """A rollout's next batch may start at `at`."""
        self.next_batch_at = at if self.next_batch_at is None else min(self.next_batch_at, at)


@dataclass
class Batch:
    """A rollout batch out of service for its change, whose apply is under way."""

    pool: str
    hosts: list[str]
    # Those of its hosts that are Kubernetes nodes (uncordoned after).
    nodes: list[str]
    # The desired state each host's apply reaches (as the cycle that started it saw).
    desired: dict[str, str]
    cluster: bool
    started: float
    result: Future[RunResult]
    # host -> the GPU remediation remediate.yml makes before the apply ({action, gpus}).
    remedies: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Context:
    """What the phases work with across cycles."""

    engine: Engine
    writer: Writer
    settings: Settings
    clock: Callable[[], float]
    rng: random.Random
    stop: Stop
    # A rollout batch's apply runs beside the cycles (the long-running loop);
    # otherwise the cycle waits for it (one cycle, tests).
    background: bool = False
    executor: ThreadPoolExecutor | None = None
    # pool -> its batch whose apply is under way.
    batches: dict[str, Batch] = field(default_factory=dict)
    # host -> the desired state whose settings were found well-formed.
    settings_checked: dict[str, str] = field(default_factory=dict)

    @property
    def observe(self) -> Observers:
        return self.writer.observe

    def applying(self) -> dict[str, Batch]:
        """The hosts of the batches under way, each with its batch."""
        return {host: batch for batch in self.batches.values() for host in batch.hosts}


@dataclass
class Cycle:
    """One cycle's working memory, handed from phase to phase."""

    report: CycleReport
    hostvars: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    desired: Mapping[str, str] = field(default_factory=dict)
    records: dict[str, HostRecord] = field(default_factory=dict)
    policies: Mapping[str, RolloutPolicy] = field(default_factory=dict)
    now: float = 0.0
    # The inventory applies the cluster side: every apply includes it.
    cluster: bool = False
    due: list[str] = field(default_factory=list)
    probes: dict[str, ProbeResult] = field(default_factory=dict)
    # Host -> why it is to be planned (or applied straight away).
    candidates: dict[str, list[str]] = field(default_factory=dict)
    # Hosts whose Node labels the cluster side owes (with why), and whether it owes
    # its objects.
    owed: dict[str, list[str]] = field(default_factory=dict)
    cluster_objects: bool = False
    # Hosts whose Node labels drifted this cycle (their repair is corrective).
    cluster_drifted: frozenset[str] = frozenset()
    to_apply: list[str] = field(default_factory=list)
    to_roll: list[str] = field(default_factory=list)

    def outcome(self, host: str, action: Action, **fields: Any) -> HostOutcome:
        """Set (replace) a host's outcome this cycle and return it."""
        outcome = HostOutcome(host, action, **fields)
        self.report.outcomes[host] = outcome
        return outcome
