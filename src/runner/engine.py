"""The Ansible adapter: runs the project's playbooks with ansible-runner and turns
their events into per-host, per-stage results.

Nothing above this module knows about Ansible's event format; nothing in it knows
about the reconcile loop. `Engine` is the interface the loop uses (tests give the
loop a fake one).
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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
# What the project's playbooks and roles are made of: their hash is part of every
# host's desired state, so editing a role makes every host due for a plan.
PROJECT_PARTS = ("site.yml", "playbooks", "roles", "collections", "ansible.cfg")
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
# The tag of playbooks/report.yml's verdict, which fails the run once (on whichever
# host comes first) for a stage that failed anywhere: it says nothing about that
# host, and the runner reads each stage's outcome itself, so its runs skip it.
VERDICT_TAG = "verdict"
# Forks when neither --forks nor the inventory sets them: one per host of the run,
# up to this many per controller CPU (past that the controller paces the run, not
# the nodes' round trips).
FORKS_PER_CPU = 10
# The inventory's forks for the reconciler's runs (group_vars/all), under --forks.
FORKS_VARIABLE = "gpufleet_reconcile_forks"


class EngineError(Exception):
    """Ansible could not be run at all (missing binary, unreadable inventory)."""


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
        driver change that reloads or reboots, a MIG layout change, or a container
        runtime restarted with a new configuration."""
        runtime = self.stages.get("runtime_config") or {}
        reloads = any(
            bool((self.stages.get(stage) or {}).get("disruptive"))
            and stage in self.changed_components
            for stage in ("driver", "mig")
        )
        return reloads or bool(runtime.get("changed"))


@dataclass
class RunResult:
    hosts: dict[str, HostRun]
    status: str = "successful"
    canceled: bool = False
    # The cluster side's part of the run (its changes and failures), when it ran.
    cluster: HostRun | None = None


ProgressCallback = Callable[[str, str], None]


class Engine(Protocol):
    """What the reconcile loop needs from Ansible."""

    def inventory(self, limit: str | None = None) -> dict[str, dict[str, Any]]: ...

    def desired_hashes(self, hostvars: Mapping[str, Mapping[str, Any]]) -> dict[str, str]: ...

    def check_settings(self, hosts: Sequence[str]) -> dict[str, str]:
        """The hosts whose settings a stage would refuse, each with why (on the controller)."""
        ...

    def probe(self, hosts: Sequence[str], cluster: bool = False) -> dict[str, ProbeResult]:
        """Each host's probe; with `cluster`, the cluster side's too, as CLUSTER_HOST."""
        ...

    def converge(self, hosts: Sequence[str], check: bool, cluster: bool = False) -> RunResult:
        """Run site.yml on `hosts`; with `cluster`, its cluster side too (once)."""
        ...

    def node_action(self, action: str, hosts: Sequence[str]) -> RunResult: ...

    def slurm_action(self, action: str, hosts: Sequence[str], reason: str = "") -> RunResult:
        """Drain (with `reason`), list the jobs of, or resume the hosts' nodes in Slurm
        (playbooks/slurm_drain.yml); each HostRun's `slurm` says what Slurm had."""
        ...

    def beside(self) -> Engine:
        """An engine for runs at the same time as this one's (a rollout batch's apply
        while the loop goes on), on hosts none of this one's runs touch."""
        ...


def project_hash(root: Path) -> str:
    """A hash of every file the playbooks run (roles, collection, playbooks); not of
    their documentation or the collection's changelog, which change no run (editing
    a role's README must not re-plan the fleet)."""
    digest = hashlib.sha256()
    for part in PROJECT_PARTS:
        base = root / part
        paths = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in paths:
            if {"__pycache__", "changelogs"} & set(path.parts) or path.suffix in (".md", ".rst"):
                continue
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def desired_hash(project: str, hostvars: Mapping[str, Any]) -> str:
    text = json.dumps(hostvars, sort_keys=True, default=str)
    return hashlib.sha256(f"{project}\0{text}".encode()).hexdigest()


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

    def __init__(self, progress: ProgressCallback | None = None) -> None:
        self.hosts: dict[str, HostRun] = {}
        self.probes: dict[str, ProbeResult] = {}
        # ansible-runner's verdict on the whole run, once it has ended.
        self.status = "running"
        self._progress = progress
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
        if not host or kind not in (
            "runner_on_ok",
            "runner_on_failed",
            "runner_on_unreachable",
        ):
            return True
        res = data.get("res") or {}
        role = data.get("role") or ""
        task = data.get("task") or ""
        run = self._host(host)
        if kind == "runner_on_unreachable":
            run.reachable = False
            run.failures.append(f"unreachable: {res.get('msg', '')}".strip())
            self.probes[host] = ProbeResult(host, reachable=False, reason=str(res.get("msg")))
            self._say(host, "unreachable")
            return True
        if kind == "runner_on_failed":
            if not data.get("ignore_errors"):
                where = f"{role}: " if role else ""
                failure = f"{where}{task}: {res.get('msg', 'failed')}"
                if role in STAGES and role not in run.stages:
                    self._unanswered.setdefault((host, role), []).append(failure)
                else:
                    run.failures.append(failure)
                self._say(host, f"failed: {where}{task}")
            return True
        action = data.get("resolved_action") or data.get("task_action")
        if action == PROBE_MODULE and "drifted" in res:
            self.probes[host] = _probe_result(host, res)
            return True
        if action == ROLLOUT_MODULE:
            run.action_changed = bool(res.get("changed"))
            return True
        slurm = (res.get("ansible_facts") or {}).get(SLURM_FACT)
        if isinstance(slurm, Mapping):
            run.slurm = dict(slurm)
            return True
        cluster_probe = (res.get("ansible_facts") or {}).get(CLUSTER_PROBE_FACT)
        if host == CLUSTER_HOST and isinstance(cluster_probe, Mapping):
            self.probes[host] = _probe_result(host, cluster_probe)
            return True
        for stage in STAGES:
            outcome = (res.get("ansible_facts") or {}).get(f"{stage}_stage")
            if isinstance(outcome, Mapping):
                run.stages[stage] = dict(outcome)
                self._unanswered.pop((host, stage), None)
                self._say(host, f"{stage}: {outcome.get('status')}")
        if res.get("changed") and role:
            text = _diff_text(res)
            if not text and data.get("task_action") in _SAYING and isinstance(res.get("msg"), str):
                text = res["msg"]  # a role's prediction, said in words (check mode)
            run.changes.append(Change(role, task, text))
        return True

    def finish(self, status: str) -> None:
        """The run ended with ansible-runner's `status`: failures no stage outcome
        answered (a role that stopped before publishing one) count as they are."""
        self.status = status
        for (host, _role), failures in sorted(self._unanswered.items()):
            self._host(host).failures.extend(failures)
        self._unanswered.clear()

    def _say(self, host: str, text: str) -> None:
        if self._progress is not None:
            self._progress(host, text)


def _probe_result(host: str, res: Mapping[str, Any]) -> ProbeResult:
    drift: list[dict[str, Any]] = []
    found = res.get("drift") or {}
    if isinstance(found, list):  # the cluster probe's items name their component
        drift.extend(dict(item) for item in found)
    else:
        for component, items in sorted(found.items()):
            for item in items:
                drift.append({"component": component, **item})
    return ProbeResult(
        host,
        recorded=bool(res.get("recorded")),
        drift=drift,
        reason=str(res.get("reason") or ""),
    )


class AnsibleEngine:
    """Runs the project's playbooks against one inventory with ansible-runner."""

    def __init__(
        self,
        project: Path,
        inventory: str,
        work_dir: Path,
        keep_runs: int = 10,
        forks: int | None = None,
        extravars: Mapping[str, Any] | None = None,
        progress: ProgressCallback | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> None:
        self.project = project
        self.inventory_path = inventory
        self.work_dir = work_dir
        self.keep_runs = keep_runs
        # None: the inventory's FORKS_VARIABLE, else default_forks(hosts of the run).
        self.forks = forks
        self._inventory_forks: int | None = None
        self.extravars = dict(extravars or {})
        self.progress = progress
        self.cancel = cancel
        self._bin = Path(sys.executable).parent

    def _binary(self, name: str) -> str:
        local = self._bin / name
        return str(local) if local.exists() else name

    def _env(self) -> dict[str, str]:
        return {
            "ANSIBLE_CONFIG": str(self.project / "ansible.cfg"),
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_NOCOLOR": "1",
            # An inventory that does not parse is an error, not an empty fleet.
            "ANSIBLE_INVENTORY_UNPARSED_FAILED": "1",
            "PATH": f"{self._bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def inventory(self, limit: str | None = None) -> dict[str, dict[str, Any]]:
        command = [self._binary("ansible-inventory"), "-i", self.inventory_path, "--list"]
        if limit:
            command += ["--limit", limit]
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=self.project,
            env={**os.environ, **self._env()},
            check=False,
        )
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
            raise EngineError(
                f"inventory {self.inventory_path} cannot be read: "
                + (" ".join(errors) or proc.stderr.strip())
            )
        data = json.loads(proc.stdout)
        hostvars: dict[str, dict[str, Any]] = data.get("_meta", {}).get("hostvars", {})
        names: set[str] = set(hostvars)
        for group in data.values():
            if isinstance(group, Mapping):
                names.update(group.get("hosts", []))
        if limit and not names:
            raise EngineError(
                f"--limit {limit!r} matches no host of inventory {self.inventory_path}"
            )
        self._inventory_forks = inventory_forks(hostvars)
        return {name: hostvars.get(name, {}) for name in sorted(names)}

    def desired_hashes(self, hostvars: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        project = project_hash(self.project)
        return {host: desired_hash(project, values) for host, values in hostvars.items()}

    def _run(
        self,
        playbook: str,
        hosts: Sequence[str],
        cmdline: Iterable[str] = (),
        extravars: Mapping[str, Any] | None = None,
    ) -> EventCollector:
        import ansible_runner  # imported late: it is slow to import and not always needed

        collector = EventCollector(self.progress)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        runner = ansible_runner.run(
            private_data_dir=str(self.work_dir),
            project_dir=str(self.project),
            playbook=str(self.project / playbook),
            inventory=str(Path(self.inventory_path).resolve()),
            limit=",".join(hosts),
            forks=self.forks or self._inventory_forks or default_forks(len(hosts)),
            cmdline=" ".join([*cmdline, "--skip-tags", VERDICT_TAG]),
            extravars={**self.extravars, **(extravars or {})},
            envvars=self._env(),
            rotate_artifacts=self.keep_runs,
            quiet=True,
            event_handler=collector,
            cancel_callback=self.cancel,
            suppress_env_files=True,
        )
        collector.finish(runner.status)
        if runner.status in ("failed", "successful", "canceled"):
            return collector
        output = runner.stdout.read() if runner.stdout else ""
        raise EngineError(f"ansible-playbook {playbook} did not run ({runner.status}): {output}")

    def check_settings(self, hosts: Sequence[str]) -> dict[str, str]:
        collector = self._run("playbooks/settings.yml", hosts)
        return {
            host: "; ".join(run.failures)
            for host, run in sorted(collector.hosts.items())
            if run.failures
        }

    def probe(self, hosts: Sequence[str], cluster: bool = False) -> dict[str, ProbeResult]:
        collector = self._run("playbooks/probe.yml", _with_cluster(hosts, cluster))
        results = dict(collector.probes)
        for host in _with_cluster(hosts, cluster):
            failures = collector.hosts[host].failures if host in collector.hosts else []
            reason = "; ".join(failures) or "the probe did not report"
            results.setdefault(host, ProbeResult(host, reachable=False, reason=reason))
        return results

    def converge(self, hosts: Sequence[str], check: bool, cluster: bool = False) -> RunResult:
        cmdline = ["--diff"] + (["--check"] if check else [])
        playbook = "site.yml"
        if cluster and not hosts:
            # The cluster side alone. A --limit that matches no inventory host stops
            # ansible-playbook before any play, and the implicit localhost matches
            # none: name localhost as a host of its own.
            playbook = "playbooks/k8s_manifests.yml"
            cmdline += ["-i", f"{CLUSTER_HOST},"]
        collector = self._run(playbook, _with_cluster(hosts, cluster), cmdline)
        result = _result(collector, hosts)
        if cluster:
            result.cluster = collector.hosts.get(CLUSTER_HOST) or HostRun(
                CLUSTER_HOST, reachable=False, failures=["the cluster side did not run"]
            )
        return result

    def beside(self) -> AnsibleEngine:
        # Its own run directory: ansible-runner rotates the artifacts of the runs in
        # one directory, which must not remove those of a run still going.
        other = copy.copy(self)
        other.work_dir = self.work_dir / "beside"
        return other

    def node_action(self, action: str, hosts: Sequence[str]) -> RunResult:
        collector = self._run(
            "playbooks/rollout.yml",
            hosts,
            extravars={"gpufleet_rollout_action": action},
        )
        return _result(collector, hosts)

    def slurm_action(self, action: str, hosts: Sequence[str], reason: str = "") -> RunResult:
        collector = self._run(
            "playbooks/slurm_drain.yml",
            hosts,
            extravars={
                "gpufleet_slurm_action": action,
                "gpufleet_slurm_reason": reason,
                # A node gpufleet drained is resumed even if slurmd no longer runs
                # (slurm_drain auto would leave it drained).
                **({"slurm_drain": "true"} if action == "resume" else {}),
            },
        )
        return _result(collector, hosts)


def default_forks(hosts: int, cpus: int | None = None) -> int:
    """Forks for a run over `hosts` hosts: one each, up to FORKS_PER_CPU per CPU."""
    return max(1, min(hosts, FORKS_PER_CPU * (cpus or os.cpu_count() or 1)))


def inventory_forks(hostvars: Mapping[str, Mapping[str, Any]]) -> int | None:
    """The forks the inventory sets (FORKS_VARIABLE), None when it sets none.

    A controller setting: one positive integer for the whole inventory. A value that
    is not one, or hosts that disagree, is an error naming the hosts."""
    found: dict[str, int] = {}
    for host, values in sorted(hostvars.items()):
        if FORKS_VARIABLE not in values:
            continue
        value = values[FORKS_VARIABLE]
        text = str(value)
        if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
            raise EngineError(
                f"{FORKS_VARIABLE} on host {host}: expected a positive integer, got {value!r}"
            )
        found[host] = int(text)
    if len(set(found.values())) > 1:
        seen = ", ".join(f"{host} {forks}" for host, forks in found.items())
        raise EngineError(
            f"{FORKS_VARIABLE}: expected one value for the whole inventory (set it in "
            f"group_vars/all), got {seen}"
        )
    return next(iter(found.values()), None)


def _with_cluster(hosts: Sequence[str], cluster: bool) -> list[str]:
    return [*hosts, CLUSTER_HOST] if cluster else list(hosts)


def _result(collector: EventCollector, hosts: Sequence[str]) -> RunResult:
    status = collector.status
    results = {host: collector.hosts.get(host, HostRun(host)) for host in hosts}
    for host, run in results.items():
        if host not in collector.hosts and status != "canceled":
            run.reachable = False
            run.failures.append("the run did not reach the host")
    return RunResult(results, status=status, canceled=status == "canceled")
