# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Progress while a run runs (runner.progress): the account of a run's hosts, the
log lines a quiet run still gives, and the live table a terminal shows, fed by a
real ansible-playbook run's events."""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import sys
import time
from pathlib import Path

from rich.console import Console

from conftest import local_inventory
from runner import cli
from runner.engine import AnsibleEngine
from runner.progress import LiveProgress, LogProgress, Progress, RunProgress, where


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_runs_account_counts_hosts_through_and_times_each_from_its_first_task():
    clock = Clock()
    run = RunProgress(Progress(), "apply", ["a", "b", "c"], now=clock)
    run.task_started("a", "driver", "Install the driver packages")
    clock.now += 5
    run.task_started("b", "driver", "Install the driver packages")
    clock.now += 10
    run.said("b", "failed: driver: Load the module", failed=True)
    run.host_through("a")
    view = run.view()
    assert view.headline() == "apply: 1 of 3 hosts through, 1 failed (0:15)"
    lines = {line.host: line for line in view.hosts}
    assert (lines["a"].state, lines["a"].elapsed) == ("done", 15.0)
    assert (lines["b"].state, lines["b"].stage, lines["b"].elapsed) == ("running", "driver", 10.0)
    assert (lines["c"].state, lines["c"].elapsed) == ("waiting", 0.0)
    assert where(view) == "driver: b 0:10; starting: c 0:00"
    run.task_started("a", "mig", "late event")  # a host through stays through
    assert run.view().hosts[0].stage == "driver"
    run.ended("failed")
    assert run.view().headline() == "apply: 3 of 3 hosts through, 1 failed (0:15)"


def test_a_quiet_run_still_logs_where_its_hosts_are_and_json_lines_carry_them(caplog):
    shown = LogProgress(heartbeat=0.2)
    with caplog.at_level(logging.INFO, logger="runner"):
        run = shown.run("apply", ["a", "b"])
        run.task_started("a", "driver", "Install the driver packages")
        run.task_started("b", "mig", "Apply the layout")
        deadline = time.monotonic() + 10
        while "running" not in [getattr(r, "progress", {}).get("event") for r in caplog.records]:
            assert time.monotonic() < deadline, "no heartbeat line"
            time.sleep(0.05)
        run.host_through("a")
        run.ended("successful")
    beat = next(r for r in caplog.records if getattr(r, "progress", {}).get("event") == "running")
    assert beat.getMessage().startswith("apply: 0 of 2 hosts through (0:0")
    assert beat.getMessage().endswith("; driver: a 0:00; mig: b 0:00")
    line = json.loads(cli._JsonFormatter().format(beat))
    assert line["progress"]["total"] == 2
    assert [h["stage"] for h in line["progress"]["hosts"]] == ["driver", "mig"]
    said = [r.getMessage() for r in caplog.records]
    assert said[-1].startswith("apply: 2 of 2 hosts through") and said[-1].endswith("; successful")
    assert [getattr(r, "progress", {}).get("event") for r in caplog.records] == [
        *["running"] * (len(said) - 1),
        "finished",
    ], "a quiet run's lines are its heartbeats and its end"


def _args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"quiet": False, "log_format": "text", **given})


def test_the_table_only_on_a_terminal_and_nothing_with_quiet(monkeypatch):
    assert type(cli._progress(_args(quiet=True))) is Progress
    assert type(cli._progress(_args(log_format="json"))) is LogProgress
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    assert type(cli._progress(_args())) is LogProgress


# Escape sequences that move the cursor or erase end a line; the others go.
MOVES = re.compile(r"\x1b\[[0-9;]*[ABJK]|\r")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_a_terminal_shows_each_host_at_its_stage_live_then_the_runs_headline(
    tmp_path: Path, caplog
):
    project = tmp_path / "project"
    tasks = project / "roles" / "driver" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text(
        "- name: Take a while\n  ansible.builtin.command: sleep 2\n  changed_when: false\n"
        "  failed_when: inventory_hostname == 'n2'\n"
    )
    (project / "site.yml").write_text("- hosts: all\n  gather_facts: false\n  roles: [driver]\n")
    inventory = local_inventory(tmp_path / "inventory.yml", "n1", "n2")
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, height=30)
    live = LiveProgress(console)
    engine = AnsibleEngine(project, str(inventory), tmp_path / "ansible", progress=live)
    with caplog.at_level(logging.INFO, logger="runner"):
        engine._run("apply", "site.yml", ["n1", "n2"])
    frames = ANSI.sub("", MOVES.sub("\n", screen.getvalue()))
    assert re.search(r"^apply: 0 of 2 hosts through \(0:0\d\)\s*$", frames, re.M), frames
    rows = [line.split() for line in frames.splitlines()]
    for host in ("n1", "n2"):
        row = ["driver", "(1/8)", "Take", "a", "while"]
        assert any(r[:6] == [host, *row] and r[-1] == "running" for r in rows), frames
    assert live._live is None, "the table is gone once the run has ended"
    # n2's stage failed and no outcome of the stage answered for it: a failed host.
    ended = caplog.records[-1].getMessage()
    assert re.fullmatch(r"apply: 2 of 2 hosts through, 1 failed \(0:0\d\); failed", ended)
