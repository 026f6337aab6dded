# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every way a stage can fail reaches the operator with a reason: the table of the
roles' refusals is read from the roles themselves, and each one is driven through
the path a real failure takes (the role's rescue and its failure_reason filter, or
ansible-core's wrapping of a refusal raised while templating, or the task's own
failure) into the runner's record. What the operator reads — `status`, the cycle's
report and `history` — must carry the role's words, naming the host and what to do."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.filter.failures import failure_reason
from runner import show
from runner.engine import STAGES, EventCollector, HostRun, ProbeResult, RunResult
from runner.reconcile import Reconciler, Settings
from runner.state import StateStore

ROLES = Path(__file__).resolve().parents[2] / "roles"
HOST = "gpu-7"
# A refusal says what to do about it: one of these, as the roles word it.
WHAT_TO_DO = re.compile(
    r"\b(install|set|stop|add|remove|check|fix|start|leave|run again|journalctl)\b", re.I
)


def _fail_tasks(tasks: Sequence[Any], found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for nested in ("block", "rescue", "always"):
            _fail_tasks(task.get(nested) or [], found)
        if "ansible.builtin.fail" in task:
            found.append((task["name"], str(task["ansible.builtin.fail"]["msg"])))
    return found


def refusals() -> list[Any]:
    """(role, task, message template) of every fail task in the roles, but those that
    fail the host after its stage's outcome was published (they repeat its reason)."""
    rows = []
    for path in sorted(ROLES.glob("*/tasks/*.yml")):
        for task, msg in _fail_tasks(yaml.safe_load(path.read_text()), []):
            if not task.startswith("Fail the node whose"):
                role = path.parts[-3]
                rows.append(pytest.param(role, task, msg, id=f"{role}:{path.stem}:{task}"))
    return rows


def rendered(template: str) -> str:
    """The message as a host would get it: the host's name, and a word for the rest."""
    text = re.sub(r"\{\{\s*inventory_hostname\s*\}\}", HOST, template)
    # On one line, as failure_reason and the runner put it.
    return " ".join(re.sub(r"\{\{.*?\}\}", "x", text, flags=re.S).split())


def test_the_table_is_read_from_the_roles() -> None:
    assert {p.values[0] for p in refusals()} >= {"driver", "mig", "slurm_gres", "runtime_config"}


@pytest.mark.parametrize(("role", "task", "template"), refusals())
def test_each_refusal_names_the_host_and_what_to_do(role: str, task: str, template: str) -> None:
    message = rendered(template)
    assert HOST in message, f"{role}: {task!r} does not name the host"
    assert WHAT_TO_DO.search(message), f"{role}: {task!r} does not say what to do"


@pytest.mark.parametrize("role", [s for s in STAGES if (ROLES / s / "tasks" / "main.yml").exists()])
def test_each_stage_records_its_failures_through_one_filter(role: str) -> None:
    """Every stage role's rescue keeps the failed task's words with failure_reason
    (so no stage wraps or loses them its own way)."""
    tasks = "\n".join(p.read_text() for p in (ROLES / role / "tasks").glob("*.yml"))
    if "rescue:" in tasks:
        assert "gpufleet.nvidia.failure_reason(" in tasks
        assert "ansible_failed_result.msg" not in tasks


class OneHost:
    """An engine with one host, new to gpufleet, whose first apply gives `run`."""

    def __init__(self, run: HostRun) -> None:
        self.run = run

    def inventory(self, limit: str | None = None) -> dict[str, dict[str, Any]]:
        return {HOST: {}}

    def inventory_hosts(self) -> list[str]:
        return [HOST]

    def desired_hashes(self, hostvars: Any) -> dict[str, str]:
        return {HOST: "v1"}

    def check_settings(self, hosts: Sequence[str]) -> dict[str, str]:
        return {}

    def probe(self, hosts: Sequence[str], cluster: bool = False) -> dict[str, ProbeResult]:
        return {HOST: ProbeResult(HOST, reachable=True, recorded=False)}

    def converge(self, hosts: Sequence[str], check: bool, cluster: bool = False) -> RunResult:
        return RunResult({HOST: self.run})


def operator_sees(run: HostRun, tmp_path: Path) -> list[str]:
    """What status, the cycle's report and history say of the host after `run`."""
    with StateStore(tmp_path / "state") as store:
        engine = OneHost(run)
        reconciler = Reconciler(engine, store, Settings(), rng=random.Random(1))  # type: ignore[arg-type]
        report = reconciler.cycle()
        record = store.host(HOST)
        history = [e.summary for e in store.history(HOST, kinds=["failure"])]
    assert record.status == "failed" or record.status == "unreachable"
    return [show.host_line(record), report.outcomes[HOST].message, *history]


def stage_failed(role: str, reason: str) -> HostRun:
    stages = {s: {"status": "ready"} for s in STAGES}
    stages[role] = {"status": "failed", "reason": reason}
    return HostRun(HOST, stages=stages)


@pytest.mark.parametrize(("role", "task", "template"), refusals())
def test_a_refusal_in_a_stage_reaches_the_operator(
    role: str, task: str, template: str, tmp_path: Path
) -> None:
    """The role's rescue keeps the refusal (failure_reason) in its stage's outcome."""
    message = rendered(template)
    reason = failure_reason({"msg": message}, task, limit=2000)
    for said in operator_sees(stage_failed(role, reason), tmp_path):
        assert message in said


@pytest.mark.parametrize(("role", "task", "template"), refusals())
def test_a_refusal_raised_while_templating_reaches_the_operator_unwrapped(
    role: str, task: str, template: str, tmp_path: Path
) -> None:
    """A refusal a filter raises, wrapped by ansible-core, with no outcome after it
    (the role stopped): the task's failure itself, in the role's words alone."""
    message = rendered(template)
    wrapped = (
        "Task failed: Finalization of task args for 'ansible.builtin.set_fact' failed: Error "
        f"while resolving value for '_x': The filter plugin 'gpufleet.nvidia.x' failed: {message}"
    )
    collector = EventCollector()
    data = {"host": HOST, "role": role, "task": task, "res": {"msg": wrapped}}
    collector({"event": "runner_on_failed", "event_data": data})
    collector.finish("failed")
    for said in operator_sees(collector.hosts[HOST], tmp_path):
        assert message in said
        assert "Task failed" not in said and "Finalization" not in said


@pytest.mark.parametrize(
    ("run", "words"),
    [
        (stage_failed("toolkit", "Install the toolkit: No package matching 'x'"), "No package"),
        (
            HostRun(HOST, reachable=False, failures=[f"unreachable: ssh: connect to host {HOST}"]),
            f"connect to host {HOST}",
        ),
        (HostRun(HOST, failures=["driver: Install the driver: apt failed"]), "apt failed"),
    ],
    ids=["module-in-a-stage", "unreachable", "task-without-outcome"],
)
def test_other_failures_reach_the_operator(run: HostRun, words: str, tmp_path: Path) -> None:
    for said in operator_sees(run, tmp_path):
        assert words in said
