# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Ansible adapter: runs the project's playbooks with ansible-runner and turns
their events into per-host, per-stage results; reads the inventory as
`ansible-inventory --list` does, with Ansible's API in this process where it can.

Nothing above this module knows about Ansible's event format; nothing in it knows
about the reconcile loop. `Engine` is the interface the loop uses (tests give the
loop a fake one).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from runner import inventory as in_process
from runner import ptyclose, site
from runner.desired import (
    desired_hash,
    project_files,
    project_fingerprint,
    project_hash,
)
from runner.progress import Progress
from runner.runs import (
    CLUSTER_HOST,
    CLUSTER_PROBE_FACT,
    PASSING,
    PROBE_MODULE,
    ROLLOUT_MODULE,
    SLURM_FACT,
    STAGES,
    Change,
    EventCollector,
    HostRun,
    ProbeResult,
    RunResult,
    collected,
    stage_passed,
)

__all__ = [
    "CLUSTER_HOST",
    "CLUSTER_PROBE_FACT",
    "PASSING",
    "PROBE_MODULE",
    "ROLLOUT_MODULE",
    "SLURM_FACT",
    "STAGES",
    "AnsibleEngine",
    "Change",
    "Engine",
    "EngineError",
    "EventCollector",
    "HostRun",
    "InventoryError",
    "ProbeResult",
    "RunResult",
    "default_forks",
    "desired_hash",
    "inventory_forks",
    "project_hash",
    "stage_passed",
]

log = logging.getLogger("runner")

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
# The hosts gpufleet manages: the node plays' `hosts:`, an extra var (a play's hosts
# are templated before any inventory variable is known), the group gpu_nodes unless
# --hosts names another pattern. Hosts outside it are never contacted.
HOSTS_VARIABLE = "gpufleet_hosts"
DEFAULT_HOSTS = "gpu_nodes"


class EngineError(Exception):
    """Ansible could not be run, or its run could not be read."""


class InventoryError(EngineError):
    """The inventory cannot be read, or its settings for the controller are wrong:
    bad input, found before any host is touched."""


class Engine(Protocol):
    """What the reconcile loop needs from Ansible."""

    def inventory(self, limit: str | None = None) -> dict[str, dict[str, Any]]: ...

    def inventory_hosts(self) -> Collection[str]:
        """Every host of the inventory at the last read, managed or not."""
        ...

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

    def node_action(
        self, action: str, hosts: Sequence[str], health: Mapping[str, str | None] | None = None
    ) -> RunResult:
        """Cordon, drain or uncordon the hosts' Kubernetes nodes (playbooks/rollout.yml);
        `health` sets (host -> what its GPUs ask) or removes (None) their GPU health label."""
        ...

    def slurm_action(self, action: str, hosts: Sequence[str], reason: str = "") -> RunResult:
        """Drain (with `reason`), list the jobs of, or resume the hosts' nodes in Slurm
        (playbooks/slurm_drain.yml); each HostRun's `slurm` says what Slurm had."""
        ...

    def remediate(self, remedies: Mapping[str, Mapping[str, Any]]) -> RunResult:
        """Reset GPUs or reboot nodes (playbooks/remediate.yml): host -> {action, gpus};
        each HostRun's `remedy` says what was done."""
        ...

    def beside(self) -> Engine:
        """An engine for runs at the same time as this one's (a rollout batch's apply
        while the loop goes on), on hosts none of this one's runs touch."""
        ...


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
        progress: Progress | None = None,
        cancel: Callable[[], bool] | None = None,
        hosts: str = DEFAULT_HOSTS,
        options: Sequence[str] = (),
        vault_options: Sequence[str] = (),
    ) -> None:
        """`options`: ansible-playbook's for every run (site.passed_through), of which
        `vault_options` go to the inventory's readers too."""
        self.project = project
        self.inventory_path = inventory
        self.hosts = hosts
        self.options = list(options)
        self.vault_options = list(vault_options)
        # The site's configuration, found once from where the runner started, which is
        # where every run starts too: relative paths in the site's inventory, settings
        # and environment mean what they mean to the site's own Ansible runs.
        self.cwd = Path.cwd()
        self._config = site.config_environment(project)
        self.work_dir = work_dir
        self.keep_runs = keep_runs
        # None: the inventory's FORKS_VARIABLE, else default_forks(hosts of the run).
        self.forks = forks
        self._inventory_forks: int | None = None
        self._all_hosts: list[str] = []
        self.extravars = dict(extravars or {})
        self.progress = progress
        self.cancel = cancel
        self._bin = Path(sys.executable).parent
        # project_fingerprint() and project_hash() when desired_hashes() last hashed.
        self._project_hash: tuple[tuple[tuple[str, int, int, int], ...], str] | None = None

    def _binary(self, name: str) -> str:
        local = self._bin / name
        return str(local) if local.exists() else name

    def _env(self) -> dict[str, str]:
        return {
            **self._config,
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_NOCOLOR": "1",
            # An inventory that does not parse is an error, not an empty fleet.
            "ANSIBLE_INVENTORY_UNPARSED_FAILED": "1",
            "PATH": f"{self._bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def inventory(self, limit: str | None = None) -> dict[str, dict[str, Any]]:
        """The variables of each host gpufleet manages (`self.hosts`; of those, `limit`'s
        only), as `ansible-inventory --list` gives them. An inventory with no host at
        all is an empty fleet; one whose hosts are none of those is an error."""
        hostvars, self._all_hosts = self._read(limit, self.hosts)
        if not hostvars and (limit or self._all_hosts):
            raise InventoryError(self._none_managed(limit))
        set_there = sorted(
            host
            for host, values in hostvars.items()
            if values.get(HOSTS_VARIABLE, self.hosts) != self.hosts
        )
        if set_there:
            raise InventoryError(
                f"{HOSTS_VARIABLE} is set in inventory {self.inventory_path} (on "
                f"{', '.join(set_there[:3])}{' ...' if len(set_there) > 3 else ''}), where "
                "it cannot choose the plays' hosts: remove it there and give the pattern "
                f"as --hosts (now {self.hosts!r})"
            )
        self._inventory_forks = inventory_forks(hostvars)
        return hostvars

    def inventory_hosts(self) -> Collection[str]:
        return self._all_hosts

    def _read(self, limit: str | None, pattern: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """The variables of the hosts of `pattern` and `limit`, and the names of all
        the inventory's hosts: read in this process where it reads alike, else by
        running Ansible."""
        env = self._env()
        # Vault secrets are set up by Ansible's command line, not by its inventory API.
        ansible = None if self.vault_options else in_process.ansible(env, self.cwd)
        if ansible is None:
            return self._inventory_subprocess(limit, pattern)
        try:
            return ansible.hostvars(env, self.inventory_path, self.cwd, limit, pattern)
        except in_process.Unreadable as error:
            raise InventoryError(
                f"inventory {self.inventory_path} cannot be read: {error}"
            ) from None

    def _none_managed(self, limit: str | None) -> str:
        where = f"inventory {self.inventory_path}"
        if limit:
            return (
                f"--limit {limit!r} matches no host gpufleet manages in {where} (the hosts "
                f"of {self.hosts!r}: --hosts PATTERN names others)"
            )
        return (
            f"no host of {where} is in {self.hosts!r}, the hosts gpufleet manages: put the "
            f"GPU nodes in a group {DEFAULT_HOSTS}, or name them with --hosts PATTERN"
        )

    def _inventory_subprocess(
        self, limit: str | None, pattern: str
    ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        data = json.loads(self._ansible_output(["ansible-inventory", "--list"], limit))
        hostvars: dict[str, dict[str, Any]] = data.get("_meta", {}).get("hostvars", {})
        names: set[str] = set(hostvars)
        for group in data.values():
            if isinstance(group, Mapping):
                names.update(group.get("hosts", []))
        # Of those --limit leaves, the managed hosts, as ansible-playbook's plays get them
        # (with a --limit matching none of them, `ansible --list-hosts` would fail).
        matched = self._ansible_output(["ansible", pattern, "--list-hosts"], None)
        managed = {line.strip() for line in matched.splitlines()[1:]} - {""}
        every = self._ansible_output(["ansible", "all", "--list-hosts"], None)
        return (
            {name: hostvars.get(name, {}) for name in sorted(names & managed)},
            [line.strip() for line in every.splitlines()[1:] if line.strip()],
        )

    def _ansible_output(self, command: list[str], limit: str | None) -> str:
        """The output of an Ansible command that reads the inventory only."""
        command = [
            self._binary(command[0]),
            *command[1:],
            "-i",
            self.inventory_path,
            *self.vault_options,
        ]
        if limit:
            command += ["--limit", limit]
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=self.cwd,
            env={**os.environ, **self._env()},
            check=False,
        )
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
            raise InventoryError(
                f"inventory {self.inventory_path} cannot be read: "
                + (" ".join(errors) or proc.stderr.strip())
            )
        return proc.stdout

    def desired_hashes(self, hostvars: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        # The project is hashed again only when a file of it changed (or came or went).
        files = project_files(self.project)
        fingerprint = project_fingerprint(files)
        if self._project_hash is None or self._project_hash[0] != fingerprint:
            self._project_hash = (fingerprint, project_hash(self.project, files))
        # Extra variables (-e) are every host's too.
        project = self._project_hash[1] + site.extra_vars_digest(self.options)
        return {host: desired_hash(project, values) for host, values in hostvars.items()}

    def _run(
        self,
        name: str,
        playbook: str,
        hosts: Sequence[str],
        cmdline: Iterable[str] = (),
        extravars: Mapping[str, Any] | None = None,
    ) -> EventCollector:
        """Run `playbook` on `hosts`; `name` says in progress lines what the run is."""
        import ansible_runner  # imported late: it is slow to import and not always needed

        ptyclose.install()
        ident = uuid.uuid4().hex  # the run's artifacts directory, known before it starts
        progress = self.progress.run(name, hosts) if self.progress else None
        collector = EventCollector(progress, self.work_dir / "artifacts" / ident / "stdout")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        status = "error"  # ansible-runner's, once it has one
        try:
            runner = ansible_runner.run(
                ident=ident,
                private_data_dir=str(self.work_dir),
                project_dir=str(self.cwd),
                playbook=str(self.project / playbook),
                inventory=str(Path(self.inventory_path).resolve()),
                limit=",".join(hosts),
                forks=self.forks or self._inventory_forks or default_forks(len(hosts)),
                cmdline=shlex.join([*cmdline, *self.options, "--skip-tags", VERDICT_TAG]),
                extravars={HOSTS_VARIABLE: self.hosts, **self.extravars, **(extravars or {})},
                envvars=self._env(),
                rotate_artifacts=self.keep_runs,
                quiet=True,
                event_handler=collector,
                cancel_callback=self.cancel,
                suppress_env_files=True,
            )
            status = runner.status
        finally:
            collector.finish(status)
        if status in ("failed", "successful", "canceled"):
            return collector
        output = runner.stdout.read() if runner.stdout else ""
        raise EngineError(f"ansible-playbook {playbook} did not run ({status}): {output}")

    def check_settings(self, hosts: Sequence[str]) -> dict[str, str]:
        collector = self._run("settings", "playbooks/settings.yml", hosts)
        return {
            host: "; ".join(run.failures)
            for host, run in sorted(collector.hosts.items())
            if run.failures
        }

    def probe(self, hosts: Sequence[str], cluster: bool = False) -> dict[str, ProbeResult]:
        collector = self._run("probe", "playbooks/probe.yml", _with_cluster(hosts, cluster))
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
        name = "plan" if check else "apply"
        collector = self._run(name, playbook, _with_cluster(hosts, cluster), cmdline)
        result = collected(collector, hosts)
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

    def node_action(
        self, action: str, hosts: Sequence[str], health: Mapping[str, str | None] | None = None
    ) -> RunResult:
        collector = self._run(
            action,
            "playbooks/rollout.yml",
            hosts,
            extravars={
                "gpufleet_rollout_action": action,
                "gpufleet_gpu_health": dict(health or {}),
            },
        )
        return collected(collector, hosts)

    def slurm_action(self, action: str, hosts: Sequence[str], reason: str = "") -> RunResult:
        collector = self._run(
            f"slurm {action}",
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
        return collected(collector, hosts)

    def remediate(self, remedies: Mapping[str, Mapping[str, Any]]) -> RunResult:
        hosts = sorted(remedies)
        collector = self._run(
            "remediate",
            "playbooks/remediate.yml",
            hosts,
            extravars={"gpufleet_remedies": {h: dict(remedies[h]) for h in hosts}},
        )
        return collected(collector, hosts)


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
            raise InventoryError(
                f"{FORKS_VARIABLE} on host {host}: expected a positive integer, got {value!r}"
            )
        found[host] = int(text)
    if len(set(found.values())) > 1:
        seen = ", ".join(f"{host} {forks}" for host, forks in found.items())
        raise InventoryError(
            f"{FORKS_VARIABLE}: expected one value for the whole inventory (set it in "
            f"group_vars/all), got {seen}"
        )
    return next(iter(found.values()), None)


def _with_cluster(hosts: Sequence[str], cluster: bool) -> list[str]:
    return [*hosts, CLUSTER_HOST] if cluster else list(hosts)
