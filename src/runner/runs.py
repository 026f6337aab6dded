# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""What an Ansible run found, per host and stage, and how ansible-runner's events
become it (`EventCollector`). The loop reads these results; only this module reads
Ansible's event format."""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.progress import RunProgress

log = logging.getLogger("runner")

# The node stages in the order site.yml runs them; the role of each is its name.
STAGES = (
    "driver",
    "mig",
    "toolkit",
    "runtime_config",
    "validator",
    "device_plugin",
    "exporter",
    "slurm_gres",
)
# Stage statuses that need no repair: those under which the next stage builds on a
# stage (the collection's summary filter, PASSING there) and a node without GPUs.
PASSING = ("ready", "pre-installed", "disabled", "not-a-gpu-node")
# Results are found by the module that produced them, never by a task's display name
# (renaming a task must not make the fleet look unreachable): playbooks/probe.yml's
# node_state probe, playbooks/rollout.yml's cordon, drain or uncordon.
PROBE_MODULE = "gpufleet.nvidia.node_state"
ROLLOUT_MODULE = "kubernetes.core.k8s_drain"
# The cluster side runs on the control host: a run that includes it adds this host
# to its limit (a --limit leaves the implicit localhost out otherwise), and the
# cluster probe's result is the fact CLUSTER_PROBE_FACT there.
CLUSTER_HOST = "localhost"
CLUSTER_PROBE_FACT = "k8s_manifests_probe"
# The fact playbooks/slurm_drain.yml publishes: a node's Slurm side in a rollout.
SLURM_FACT = "gpufleet_slurm"
# The fact the driver role's remediate tasks publish: what a GPU remediation did.
REMEDY_FACT = "driver_remedy_result"


def stage_passed(outcome: Mapping[str, Any]) -> bool:
    """Whether a stage's published outcome needs no repair (a stage that did not run
    needs none either). The collection's `stage_passed` filter judges alike — a
    driver gpufleet does not manage but that answers counts as passed — and
    tests/unit/test_runner_engine.py holds the two equal."""
    status = outcome.get("status")
    if status is None or status in PASSING:
        return True
    return status == "unmanaged" and bool(outcome.get("validated"))


@dataclass
class ProbeResult:
    host: str
    reachable: bool = True
    # Whether the node has a record of a successful apply to compare with.
    recorded: bool = False
    # The differences: [{component, kind, name, recorded, current}].
    drift: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    # The GPUs' health and the driver's Xid events, as the node_state probe reports
    # them (docs/health.md); None where it did not (the cluster side, an older probe).
    health: dict[str, Any] | None = None


@dataclass
class Change:
    component: str
    task: str
    diff: str = ""


@dataclass
class HostRun:
    host: str
    reachable: bool = True
    changes: list[Change] = field(default_factory=list)
    # stage -> the stage's published outcome (status, reason, ...).
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    # "role: task: message" for every task that failed the host.
    failures: list[str] = field(default_factory=list)
    # A node action (rollout.yml): whether it changed the Node (False: a cordon of a
    # Node that was cordoned already).
    action_changed: bool | None = None
    # A Slurm action (slurm_drain.yml): managed, node, state_before, state (after),
    # reason_before, admin_drained, jobs; None when none ran.
    slurm: dict[str, Any] | None = None
    # A GPU remediation (remediate.yml): done (reset | reboot), reset_failed, waits.
    remedy: dict[str, Any] | None = None
    # The GPUs' health read after a remediation's apply (node_state's `health`).
    health: dict[str, Any] | None = None
    # The pass's record (playbooks/record.yml) was written, or in a plan would be: the
    # node's record did not say what the stages manage now.
    record_changed: bool = False

    @property
    def changed_components(self) -> list[str]:
        return sorted({c.component for c in self.changes if c.component in STAGES})

    @property
    def failed_stage(self) -> tuple[str, str] | None:
        for stage in STAGES:
            outcome = self.stages.get(stage) or {}
            if not stage_passed(outcome):
                return stage, str(outcome.get("reason") or outcome.get("status"))
        return None

    @property
    def succeeded(self) -> bool:
        return self.reachable and not self.failures and self.failed_stage is None

    @property
    def disruptive(self) -> bool:
        """Whether applying this (planned) run would disrupt the node's workloads: a
        driver change that reloads or reboots (a move to the kernel driver_kernel_release
        names reboots too), a MIG layout change, or a container runtime to be restarted
        with a new configuration while containers run on it (the plan asked it; Docker's
        live-restore keeps them running)."""
        runtime = self.stages.get("runtime_config") or {}
        reloads = any(
            bool((self.stages.get(stage) or {}).get("disruptive"))
            and stage in self.changed_components
            for stage in ("driver", "mig")
        )
        return reloads or bool(runtime.get("disruptive"))


@dataclass
class RunResult:
    hosts: dict[str, HostRun]
    status: str = "successful"
    canceled: bool = False
    # The cluster side's part of the run (its changes and failures), when it ran.
    cluster: HostRun | None = None


# What ansible-core wraps around an error raised while it templates a task; the
# words the role wrote come after the last of these. The collection's failure_reason
# filter (plugins/filter/failures.py, WRAPPING) strips the same for stage outcomes; a
# unit test keeps the two equal.
UNWRAP = re.compile(
    r"^(?:Task failed: "
    r"|Finalization of task args for '[^']*' failed: "
    r"|Error while resolving value for '[^']*': "
    r"|The (?:filter|lookup|test) plugin '[^']*' failed: "
    r"|The conditional check '[^']*' failed\. The error was: )+"
)
# A changed result of these says what changes in its message rather than in a diff.
_SAYING = ("debug", "ansible.builtin.debug")


def _diff_text(res: Mapping[str, Any]) -> str:
    diffs = res.get("diff") or []
    if isinstance(diffs, Mapping):
        diffs = [diffs]
    lines: list[str] = []
    # The file on the node: a template's after_header names a temporary copy, and a
    # new file has no before_header.
    args = (res.get("invocation") or {}).get("module_args") or {}
    target = args.get("dest") or args.get("path")
    for diff in diffs:
        if not isinstance(diff, Mapping):
            continue
        if "prepared" in diff:
            lines.append(str(diff["prepared"]).rstrip())
        elif "before" in diff or "after" in diff:
            header = target or diff.get("before_header") or diff.get("after_header") or ""
            before, after = diff.get("before", ""), diff.get("after", "")
            if isinstance(before, str) and isinstance(after, str):
                lines.extend(
                    difflib.unified_diff(
                        before.splitlines(),
                        after.splitlines(),
                        f"{header} (now)",
                        f"{header} (planned)",
                        lineterm="",
                    )
                )
            else:
                lines.append(f"{header}: {before!r} -> {after!r}")
    return "\n".join(line for line in lines if line)


class EventCollector:
    """Turns ansible-runner events into HostRun results as they arrive."""

    def __init__(self, progress: RunProgress | None = None, output: Path | None = None) -> None:
        self.hosts: dict[str, HostRun] = {}
        self.probes: dict[str, ProbeResult] = {}
        # ansible-runner's verdict on the whole run, once it has ended.
        self.status = "running"
        self._progress = progress
        # Where the run's Ansible output is kept (ansible-runner's artifacts), named in
        # the progress line of a failure.
        self._output = output
        # Failed tasks of a stage whose outcome has not been published yet: a stage
        # role rescues its own failures and says in its outcome what they mean (in
        # check mode, "unverified" where an earlier stage's predicted change would
        # make the check pass). They count only if no outcome follows (finish()).
        self._unanswered: dict[tuple[str, str], list[str]] = {}

    def _host(self, name: str) -> HostRun:
        return self.hosts.setdefault(name, HostRun(host=name))

    def __call__(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host")
        if host and kind == "runner_on_start" and self._progress is not None:
            # Where the host is: its stage (a role) or, outside roles, its play.
            where = data.get("role") or data.get("play") or ""
            self._progress.task_started(host, where, data.get("task") or "")
        if not host or kind not in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
            return True
        self._host(host)  # reached (or tried): known to the run's result
        if kind == "runner_on_unreachable":
            self._unreachable(host, data.get("res") or {})
        elif kind == "runner_on_failed":
            self._failed(host, data)
        else:
            self._ok(host, data)
        return True

    def _unreachable(self, host: str, res: Mapping[str, Any]) -> None:
        run = self._host(host)
        run.reachable = False
        run.failures.append(f"unreachable: {res.get('msg', '')}".strip())
        self.probes[host] = ProbeResult(host, reachable=False, reason=str(res.get("msg")))
        self._say(host, "unreachable", failed=True)
        if self._progress is not None:
            self._progress.host_through(host, "unreachable")

    def _failed(self, host: str, data: Mapping[str, Any]) -> None:
        if data.get("ignore_errors"):
            return
        res, role, task = data.get("res") or {}, data.get("role") or "", data.get("task") or ""
        run = self._host(host)
        where = f"{role}: " if role else ""
        message = " ".join(str(res.get("msg") or "failed").split())
        unwrapped = UNWRAP.sub("", message)
        # A refusal raised while templating (a filter of the role's) is in the role's
        # words alone; a module's failure says which task it was.
        failure = f"{where}{unwrapped}" if unwrapped != message else f"{where}{task}: {message}"
        # A stage's failure counts once its outcome says what it means.
        awaiting = role in STAGES and role not in run.stages
        if awaiting:
            self._unanswered.setdefault((host, role), []).append(failure)
        else:
            run.failures.append(failure)
        output = f"; Ansible's output: {self._output}" if self._output else ""
        self._say(host, f"failed: {where}{task}{output}", failed=not awaiting)

    def _ok(self, host: str, data: Mapping[str, Any]) -> None:
        """A task's result: a probe's, a cordon's, a Slurm or cluster fact, a stage's
        outcome, or a change of a role."""
        res, role, task = data.get("res") or {}, data.get("role") or "", data.get("task") or ""
        run = self._host(host)
        facts = res.get("ansible_facts") or {}
        action = data.get("resolved_action") or data.get("task_action")
        if action == PROBE_MODULE and "drifted" in res:
            self.probes[host] = _probe_result(host, res)
            if self._progress is not None:
                self._progress.host_through(host)
        elif action == PROBE_MODULE:  # the record
            run.record_changed = bool(res.get("changed"))
        elif action == ROLLOUT_MODULE:
            run.action_changed = bool(res.get("changed"))
        elif isinstance(facts.get(SLURM_FACT), Mapping):
            run.slurm = dict(facts[SLURM_FACT])
        elif isinstance(facts.get(REMEDY_FACT), Mapping):
            run.remedy = dict(facts[REMEDY_FACT])
        elif host == CLUSTER_HOST and isinstance(facts.get(CLUSTER_PROBE_FACT), Mapping):
            self.probes[host] = _probe_result(host, facts[CLUSTER_PROBE_FACT])
        else:
            self._outcomes(host, run, facts)
            if res.get("changed") and role:
                text = _diff_text(res)
                saying = data.get("task_action") in _SAYING and isinstance(res.get("msg"), str)
                if not text and saying:
                    text = res["msg"]  # a role's prediction, said in words (check mode)
                run.changes.append(Change(role, task, text))

    def _outcomes(self, host: str, run: HostRun, facts: Mapping[str, Any]) -> None:
        """The stage outcomes a task published (as `<stage>_stage` facts)."""
        for stage in STAGES:
            outcome = facts.get(f"{stage}_stage")
            if isinstance(outcome, Mapping):
                run.stages[stage] = dict(outcome)
                self._unanswered.pop((host, stage), None)
                status = outcome.get("status")
                self._say(host, f"{stage}: {status}", failed=status == "failed")
                if stage == STAGES[-1] and self._progress is not None:
                    self._progress.host_through(host)

    def finish(self, status: str) -> None:
        """The run ended with ansible-runner's `status`: failures no stage outcome
        answered (a role that stopped before publishing one) count as they are."""
        self.status = status
        for (host, _role), failures in sorted(self._unanswered.items()):
            self._host(host).failures.extend(failures)
            if self._progress is not None:
                self._progress.fail(host)
        self._unanswered.clear()
        if self._progress is not None:
            self._progress.ended(status)
            self._progress = None

    def _say(self, host: str, text: str, failed: bool = False) -> None:
        if self._progress is not None:
            self._progress.said(host, text, failed)


def _probe_result(host: str, res: Mapping[str, Any]) -> ProbeResult:
    drift: list[dict[str, Any]] = []
    found = res.get("drift") or {}
    if isinstance(found, list):  # the cluster probe's items name their component
        drift.extend(dict(item) for item in found)
    else:
        for component, items in sorted(found.items()):
            for item in items:
                drift.append({"component": component, **item})
    health = res.get("health")
    return ProbeResult(
        host,
        recorded=bool(res.get("recorded")),
        drift=drift,
        reason=str(res.get("reason") or ""),
        health=dict(health) if isinstance(health, Mapping) else None,
    )


def collected(collector: EventCollector, hosts: Sequence[str]) -> RunResult:
    status = collector.status
    results = {host: collector.hosts.get(host, HostRun(host)) for host in hosts}
    for host, run in results.items():
        if host not in collector.hosts and status != "canceled":
            run.reachable = False
            run.failures.append("the run did not reach the host")
    return RunResult(results, status=status, canceled=status == "canceled")
