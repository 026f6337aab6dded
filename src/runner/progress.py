# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""What an Ansible run is doing while it runs: for each of its hosts the stage and
task it is at and for how long, and how many of the run's hosts are through.

`RunProgress` keeps one run's account (runs.EventCollector feeds it ansible-runner's
events); a `Progress` shows it. `LogProgress` writes log lines: the lines the run
says (a stage's outcome, a failure), where each host is while the run says nothing
for `heartbeat` seconds, and the run's headline when it ends. `LiveProgress` draws a
table on a terminal that `rich` keeps current, one row per host, above which log
lines still appear. Runs may overlap (a background apply beside a cycle's probe):
each has its own account and its own section of the table."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("runner")

# Host states in a run. A host is through when done, failed through or unreachable.
WAITING, RUNNING, DONE, UNREACHABLE = "waiting", "running", "done", "unreachable"
THROUGH = (DONE, UNREACHABLE)
# The most of a task's name the table shows.
TASK_WIDTH = 48


@dataclass(frozen=True)
class HostLine:
    """Where one host of a run is, at one moment."""

    host: str
    state: str
    stage: str
    task: str
    elapsed: float
    failed: bool


@dataclass(frozen=True)
class RunView:
    """One run at one moment: what it is, how long it has run, and its hosts."""

    name: str
    elapsed: float
    hosts: tuple[HostLine, ...]

    @property
    def through(self) -> int:
        return sum(1 for h in self.hosts if h.state in THROUGH)

    @property
    def failed(self) -> int:
        return sum(1 for h in self.hosts if h.failed or h.state == UNREACHABLE)

    def headline(self) -> str:
        failed = f", {self.failed} failed" if self.failed else ""
        hosts = "host" if len(self.hosts) == 1 else "hosts"
        return (
            f"{self.name}: {self.through} of {len(self.hosts)} {hosts} through{failed} "
            f"({clock(self.elapsed)})"
        )

    def fields(self) -> dict[str, Any]:
        """The view as a JSON log line's fields."""
        return {
            "run": self.name,
            "elapsed": round(self.elapsed, 1),
            "through": self.through,
            "total": len(self.hosts),
            "hosts": [
                {
                    "host": h.host,
                    "state": h.state,
                    "stage": h.stage,
                    "task": h.task,
                    "elapsed": round(h.elapsed, 1),
                    "failed": h.failed,
                }
                for h in self.hosts
            ],
        }


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


@dataclass
class _Host:
    state: str = WAITING
    stage: str = ""
    task: str = ""
    started: float | None = None
    ended: float | None = None
    failed: bool = False


class RunProgress:
    """One run's account of its hosts. Events arrive on the run's thread; views are
    taken on others (the table's refresh, the heartbeat), hence the lock."""

    def __init__(
        self,
        shown: Progress,
        name: str,
        hosts: Sequence[str],
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.now = now  # the run's clock (a test's own)
        self._shown = shown
        self._lock = threading.Lock()
        self._started = now()
        self._hosts = {host: _Host() for host in hosts}
        self.last_said = self._started

    def task_started(self, host: str, stage: str, task: str) -> None:
        with self._lock:
            entry = self._hosts.setdefault(host, _Host())
            if entry.state in THROUGH:
                return
            if entry.started is None:
                entry.started = self.now()
            entry.state, entry.stage, entry.task = RUNNING, stage, task

    def said(self, host: str, text: str, failed: bool = False) -> None:
        """A line worth telling (an outcome, a failure); `failed` marks the host."""
        with self._lock:
            self.last_said = self.now()
        if failed:
            self.fail(host)
        self._shown.said(self, host, text)

    def fail(self, host: str) -> None:
        with self._lock:
            self._hosts.setdefault(host, _Host()).failed = True

    def host_through(self, host: str, state: str = DONE) -> None:
        with self._lock:
            entry = self._hosts.setdefault(host, _Host())
            if entry.state in THROUGH:
                return
            entry.state, entry.task, entry.ended = state, "", self.now()
            if entry.started is None:
                entry.started = entry.ended

    def ended(self, status: str) -> None:
        """The run is over: hosts not through yet are through now (those it never
        reached, too: the run's result says why)."""
        with self._lock:
            end = self.now()
            for entry in self._hosts.values():
                if entry.state not in THROUGH:
                    entry.state, entry.task, entry.ended = DONE, "", end
                    if entry.started is None:
                        entry.started = end
        self._shown.finished(self, status)

    def view(self) -> RunView:
        with self._lock:
            now = self.now()
            lines = tuple(
                HostLine(
                    host,
                    e.state,
                    e.stage,
                    e.task,
                    0.0 if e.started is None else (e.ended or now) - e.started,
                    e.failed,
                )
                for host, e in self._hosts.items()
            )
            return RunView(self.name, now - self._started, lines)


class Progress:
    """Shows runs' progress; this base shows nothing (`--quiet`)."""

    def run(self, name: str, hosts: Sequence[str]) -> RunProgress:
        progress = RunProgress(self, name, hosts)
        self.started(progress)
        return progress

    def started(self, run: RunProgress) -> None:
        """A run began."""

    def said(self, run: RunProgress, host: str, text: str) -> None:
        """A host's line worth telling."""

    def finished(self, run: RunProgress, status: str) -> None:
        """The run ended with ansible-runner's status."""


class LogProgress(Progress):
    """Progress as log lines (one JSON object each under --log-format json, its
    fields under `progress`): the lines a run says, where its hosts are each time it
    has said nothing for `heartbeat` seconds, and its headline when it ends: a steady
    cycle's probe adds one line to a journal, not one per host."""

    def __init__(self, heartbeat: float = 30.0) -> None:
        self.heartbeat = heartbeat
        self._stops: dict[int, threading.Event] = {}

    def started(self, run: RunProgress) -> None:
        # The cycle has said what it runs on which hosts ("probing 3 host(s)").
        stop = self._stops[id(run)] = threading.Event()
        threading.Thread(target=self._beat, args=(run, stop), daemon=True).start()

    def said(self, run: RunProgress, host: str, text: str) -> None:
        log.info("  %s: %s", host, text, extra={"progress": {"run": run.name, "host": host}})

    def finished(self, run: RunProgress, status: str) -> None:
        stop = self._stops.pop(id(run), None)
        if stop is not None:
            stop.set()
        view = run.view()
        self._log(f"{view.headline()}; {status}", "finished", view)

    def _beat(self, run: RunProgress, stop: threading.Event) -> None:
        while not stop.wait(min(self.heartbeat, 1.0)):
            if run.now() - run.last_said >= self.heartbeat:
                view = run.view()
                self._log(f"{view.headline()}; {where(view)}", "running", view)
                run.last_said = run.now()

    @staticmethod
    def _log(text: str, event: str, view: RunView) -> None:
        log.info("%s", text, extra={"progress": {"event": event, **view.fields()}})


def where(view: RunView, names: int = 3) -> str:
    """Where the hosts not through are, by stage: `driver: a, b; mig: c (+2)`."""
    stages: dict[str, list[HostLine]] = {}
    for line in view.hosts:
        if line.state not in THROUGH:
            stages.setdefault(line.stage or "starting", []).append(line)
    parts = []
    for stage, lines in stages.items():
        shown = ", ".join(f"{h.host} {clock(h.elapsed)}" for h in lines[:names])
        more = f" (+{len(lines) - names})" if len(lines) > names else ""
        parts.append(f"{stage}: {shown}{more}")
    return "; ".join(parts) or "all through"


class LiveProgress(Progress):
    """A table on a terminal, kept current by `rich` (twice a second): for each run
    going on, its headline ("apply: 2 of 5 hosts through (1:23)") and a row per host
    with its stage, task and time. Log lines appear above it; when the last run
    ends the table goes and the run's headline stays as a log line."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console  # imported late, as ansible_runner is

        self.console = console or Console(stderr=True)
        self._runs: list[RunProgress] = []
        self._live: Any = None
        self._lock = threading.Lock()

    def started(self, run: RunProgress) -> None:
        from rich.live import Live

        with self._lock:
            self._runs.append(run)
            if self._live is not None:
                return
            # stderr through rich while the table stands: log lines go above it.
            live = self._live = Live(
                self,
                console=self.console,
                refresh_per_second=2,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=True,
            )
        live.start()  # its drawing takes the lock (__rich__)

    def said(self, run: RunProgress, host: str, text: str) -> None:
        log.info("  %s: %s", host, text)

    def finished(self, run: RunProgress, status: str) -> None:
        with self._lock:
            if run in self._runs:
                self._runs.remove(run)
            live, self._live = (self._live, None) if not self._runs else (None, self._live)
        if live is not None:
            live.stop()
        log.info("%s; %s", run.view().headline(), status)

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        tables = []
        with self._lock:
            runs = list(self._runs)
        for run in runs:
            view = run.view()
            table = Table(title=view.headline(), title_justify="left", title_style="bold", box=None)
            for column in ("host", "stage", "task", "time", "state"):
                # The task's name gives way first on a narrow terminal.
                table.add_column(
                    column,
                    no_wrap=True,
                    overflow="ellipsis",
                    max_width=TASK_WIDTH if column == "task" else None,
                    min_width=len(UNREACHABLE) if column == "state" else None,
                )
            for line in sorted(view.hosts, key=lambda h: (h.state in THROUGH, h.host)):
                table.add_row(
                    line.host,
                    stage_label(line.stage),
                    line.task,
                    clock(line.elapsed),
                    "failed" if line.failed else line.state,
                    style="red" if line.failed else ("dim" if line.state in THROUGH else None),
                )
            tables.append(table)
        return Group(*tables)


def stage_label(stage: str) -> str:
    """A node stage with its place in the pass (`driver (1/8)`); other roles and
    plays as they are named."""
    from runner.runs import STAGES

    if stage in STAGES:
        return f"{stage} ({STAGES.index(stage) + 1}/{len(STAGES)})"
    return stage
