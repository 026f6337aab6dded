# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""`python -m runner`: commands, input checks, exit codes, status and history output.

Bad input must be refused in words before anything is touched; the real Ansible runs
are in test_runner_e2e.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runner import __version__, cli, output, show
from runner.lock import InventoryLock
from runner.reconcile import CycleReport, HostOutcome
from runner.state import HistoryEntry, HostRecord, RolloutRecord, StateStore, state_dir_for

PROJECT = Path(__file__).resolve().parents[2]
EMPTY_INVENTORY = str(PROJECT / "inventories" / "none.yml")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def data(out: str, kind: str) -> Any:
    """The data of the one JSON document a --json run printed, checked to be `kind`'s."""
    doc = json.loads(out)
    assert set(doc) == {"schema_version", "kind", "data"}, doc
    assert (doc["schema_version"], doc["kind"]) == (output.SCHEMA_VERSION, kind), doc
    return doc["data"]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def test_help_lists_the_commands_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("reconcile", "plan", "status", "history", "release"):
        assert command in out
    assert "3 another reconciler holds the inventory's lock" in " ".join(out.split())


def test_version(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert __version__ in capsys.readouterr().out


def test_module_entry_point_and_unknown_option():
    result = subprocess.run(
        [sys.executable, "-m", "runner", "reconcile", "--frobnicate"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("usage: python -m runner")
    assert "--frobnicate" in result.stderr


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--components", "driver,gpu-burn"], "unknown component gpu-burn; expected"),
        (["--interval", "-5"], "expected at least 1, got -5"),
        (["--interval", "soon"], "expected a number, got 'soon'"),
        (["--max-parallel", "0"], "expected at least 1, got 0"),
        (["--once", "--interval", "60"], "not allowed with argument --once"),
        (["--health-breaker", "-1"], "expected at least 0, got -1"),
        (["--health-window", "a day"], "expected a number, got 'a day'"),
    ],
)
def test_bad_arguments_are_refused_in_words(capsys, state, argv, words):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["reconcile", "-i", EMPTY_INVENTORY, "--state-dir", str(state), *argv])
    assert exit_info.value.code == cli.Exit.USAGE
    assert words in capsys.readouterr().err
    assert not state.exists(), "nothing was touched"


def test_the_health_options_reach_the_settings():
    parse = cli.build_parser().parse_args
    args = parse(
        ["reconcile", "-i", EMPTY_INVENTORY, "--health-breaker", "0", "--health-window", "600"]
    )
    settings = cli._settings(args, check_only=False)
    assert (settings.health_breaker, settings.health_window) == (0, 600.0)
    defaults = cli._settings(parse(["reconcile", "-i", EMPTY_INVENTORY]), False)
    assert (defaults.health_breaker, defaults.health_window) == (3, 86400.0)


def test_parallel_beyond_unavailable_is_refused(capsys, state):
    code, _, err = run(
        capsys,
        "reconcile",
        "--once",
        "-i",
        EMPTY_INVENTORY,
        "--state-dir",
        str(state),
        "--max-parallel",
        "3",
        "--max-unavailable",
        "2",
    )
    assert code == cli.Exit.USAGE
    assert "--max-parallel 3 exceeds --max-unavailable 2" in err
    assert not state.exists()


def test_json_is_one_cycles_report(capsys, state):
    argv = ["reconcile", "-i", EMPTY_INVENTORY, "--state-dir", str(state), "--json"]
    code, _, err = run(capsys, *argv)
    assert code == cli.Exit.USAGE
    assert "--json prints one cycle's report: use it with --once" in err
    code, out, _ = run(capsys, *argv, "--once")
    assert code == cli.Exit.OK
    report = data(out, "reconcile")
    assert (report["probed"], report["outcomes"], report["rollouts"]) == (0, {}, {})
    assert report["finished"] >= report["started"] > 0


def test_a_wrong_rollout_policy_in_the_inventory_is_refused_naming_it(capsys, state, tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "gpu_nodes:\n  hosts:\n    gpu-1:\n      ansible_host: 192.0.2.1\n"
        "      gpufleet_rollout_max_unavailable: 0\n"
    )
    code, _, err = run(
        capsys, "reconcile", "--once", "-i", str(inventory), "--state-dir", str(state)
    )
    assert code == cli.Exit.USAGE
    assert (
        "gpufleet_rollout_max_unavailable on host gpu-1: expected a positive integer, got 0"
    ) in err
    assert not (state_dir_for(state, str(inventory)) / "ansible").exists(), "no playbook ran"


def test_missing_inventory_is_refused(capsys, state, monkeypatch):
    monkeypatch.delenv("GPUFLEET_INVENTORY", raising=False)
    code, _, err = run(capsys, "reconcile", "--once", "--state-dir", str(state))
    assert code == cli.Exit.USAGE
    assert "no inventory: name one with -i INVENTORY" in err
    code, _, err = run(capsys, "plan", "-i", "/nonexistent/hosts.yml", "--state-dir", str(state))
    assert code == cli.Exit.USAGE
    assert "inventory '/nonexistent/hosts.yml' does not exist" in err
    assert not state.exists()


def test_the_checkout_is_found_or_named_in_words(capsys, state, tmp_path, monkeypatch):
    # Pull mode installs the package (not editable) and runs from the checkout.
    assert cli.find_project() == cli.CHECKOUT
    monkeypatch.setattr(cli, "CHECKOUT", tmp_path / "site-packages")
    monkeypatch.chdir(PROJECT)
    assert cli.find_project() == PROJECT
    monkeypatch.setenv("GPUFLEET_PROJECT", str(tmp_path))
    code, _, err = run(
        capsys, "reconcile", "--once", "-i", EMPTY_INVENTORY, "--state-dir", str(state)
    )
    assert code == cli.Exit.USAGE
    assert f"no gpufleet playbooks (site.yml and playbooks/) at $GPUFLEET_PROJECT={tmp_path}" in err
    assert "install the package, run from a checkout or set GPUFLEET_PROJECT to one" in err
    assert not state.exists()


def test_unparsable_inventory_is_an_error_in_words(capsys, state, tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts: [unclosed\n")
    code, _, err = run(
        capsys, "reconcile", "--once", "-i", str(inventory), "--state-dir", str(state)
    )
    assert code == cli.Exit.USAGE
    assert f"inventory {inventory} cannot be read" in err
    assert "Traceback" not in err


def test_a_limit_that_matches_no_host_is_an_error_naming_it(capsys, state, tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("gpu_nodes:\n  hosts:\n    gpu-1:\n")
    code, _, err = run(
        capsys, "plan", "--limit", "no-such-host", "-i", str(inventory), "--state-dir", str(state)
    )
    assert code == cli.Exit.USAGE
    assert (
        f"--limit 'no-such-host' matches no host gpufleet manages in inventory {inventory}" in err
    )


def test_an_inventory_without_the_managed_group_is_an_error_naming_it(capsys, state, tmp_path):
    """A site's inventory whose GPU nodes are in another group: nothing is contacted,
    and the error says how to name them."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "dgx:\n  hosts:\n    gpu-1:\n      gpufleet_rollout_max_unavailable: 0\n"
        "web:\n  hosts:\n    www-1:\n"
    )
    where = ["-i", str(inventory), "--state-dir", str(state)]
    code, _, err = run(capsys, "reconcile", "--once", *where)
    assert code == cli.Exit.USAGE
    assert f"no host of inventory {inventory} is in 'gpu_nodes', the hosts gpufleet manages" in err
    # Named with --hosts, the group's host is read (and its bad policy found); www-1 not.
    code, _, err = run(capsys, "reconcile", "--once", "--hosts", "dgx", *where)
    assert code == cli.Exit.USAGE
    assert "gpufleet_rollout_max_unavailable on host gpu-1: expected a positive integer" in err


def test_a_second_reconciler_on_the_same_inventory_is_refused(capsys, state):
    directory = state_dir_for(state, EMPTY_INVENTORY)
    directory.mkdir(parents=True)
    with InventoryLock(directory):
        code, _, err = run(
            capsys, "reconcile", "--once", "-i", EMPTY_INVENTORY, "--state-dir", str(state)
        )
    assert code == cli.Exit.LOCKED
    assert "another reconciler (pid " in err
    code, out, _ = run(
        capsys, "reconcile", "--once", "-i", EMPTY_INVENTORY, "--state-dir", str(state)
    )
    assert code == cli.Exit.OK, "the lock went with its holder"
    assert out.startswith("cycle: 0 probed")


def test_corrupt_state_is_a_clear_error_then_rebuilt_on_request(capsys, state):
    directory = state_dir_for(state, EMPTY_INVENTORY)
    directory.mkdir(parents=True)
    (directory / "state.db").write_bytes(b"this is not SQLite" * 100)
    code, _, err = run(capsys, "status", "-i", EMPTY_INVENTORY, "--state-dir", str(state))
    assert code == cli.Exit.STATE
    assert "is unreadable" in err and "--rebuild-state" in err
    code, _, _ = run(
        capsys, "reconcile", "--once", "-i", EMPTY_INVENTORY, "--state-dir", str(state)
    )
    assert code == cli.Exit.STATE
    code, _, err = run(
        capsys,
        "reconcile",
        "--once",
        "--rebuild-state",
        "-i",
        EMPTY_INVENTORY,
        "--state-dir",
        str(state),
    )
    assert code == cli.Exit.OK
    assert [p.name.split("-")[0] for p in directory.glob("state.db.unreadable-*")] == [
        "state.db.unreadable"
    ]
    assert (directory / "state.db").read_bytes().startswith(b"SQLite format 3")


def _seed(state: Path) -> None:
    with StateStore(state_dir_for(state, EMPTY_INVENTORY)) as store:
        store.save(
            HostRecord(
                "gpu-a",
                status="converged",
                stages={
                    "driver": "ready",
                    "mig": "ready",
                    "toolkit": "pre-installed",
                    "slurm_gres": "ready",
                },
                mig_layout="all-balanced",
                slurm_state="MIXED",
                last_reconcile=1.0,
                os="debian 13",
                driver_version="550.163.01",
            )
        )
        store.save(
            HostRecord(
                "gpu-b",
                status="failed",
                failed_stage="toolkit",
                reason="nvidia-ctk missing",
                consecutive_failures=5,
                quarantined=True,
            ),
            [HistoryEntry(2.0, "gpu-b", "quarantine", "toolkit", "after 5 consecutive failures")],
        )
        store.save(
            HostRecord(
                "gpu-c",
                status="drifted",
                drift=[{"component": "runtime_config", "kind": "file", "name": "/etc/x"}],
            ),
            [HistoryEntry(1.0, "gpu-c", "drift", "runtime_config", "file /etc/x: a -> b")],
        )
        store.save(
            HostRecord(
                "gpu-d",
                status="reboot-required",
                failed_stage="driver",
                reason="nouveau holds the GPUs; reboot the node",
                consecutive_failures=1,
            )
        )
        # Pool train's driver rollout: gpu-a done, gpu-e out of service, gpu-f next.
        store.save_rollout(RolloutRecord("train", started=time.time() - 600, done=["gpu-a"]))
        for name, phase in (("gpu-e", "drained"), ("gpu-f", "queued")):
            store.save(
                HostRecord(name, status="converged", rollout_phase=phase, rollout_pool="train")
            )


def test_status_shows_each_host_state_in_words(capsys, state):
    _seed(state)
    code, out, _ = run(capsys, "status", "-i", EMPTY_INVENTORY, "--state-dir", str(state))
    assert code == cli.Exit.FAILED, "a quarantined host makes status non-zero"
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert out.splitlines()[0].split()[:3] == ["HOST", "OS", "STATE"]
    # Each host's operating system and the driver it runs, as its last run read them.
    assert lines["gpu-a"].split()[1:3] == ["debian", "13"]
    assert lines["gpu-b"].split()[1] == "-", "no run has reached it"
    assert "converged (pre-installed: toolkit)" in lines["gpu-a"]
    assert (
        "driver=ready:550.163.01 mig=ready:all-balanced toolkit=pre-installed "
        "slurm_gres=ready:MIXED"
    ) in lines["gpu-a"]
    assert "quarantined (toolkit: nvidia-ctk missing)" in lines["gpu-b"]
    assert "drifted (runtime_config)" in lines["gpu-c"]
    assert "reboot-required (driver: nouveau holds the GPUs; reboot the node)" in lines["gpu-d"]
    assert "converged; rollout drained" in lines["gpu-e"]
    assert (
        "rollout of pool train (started 10m ago): 1 done; in flight 1: gpu-e drained; "
        "queued 1: gpu-f"
    ) in out.splitlines()
    code, out, _ = run(capsys, "status", "--json", "-i", EMPTY_INVENTORY, "--state-dir", str(state))
    assert code == cli.Exit.FAILED, "the same exit code as the table's"
    status = data(out, "status")
    hosts = {h["name"]: h for h in status["hosts"]}
    assert hosts["gpu-b"]["quarantined"] is True
    assert (hosts["gpu-a"]["mig_layout"], hosts["gpu-b"]["mig_layout"]) == ("all-balanced", "")
    assert hosts["gpu-c"]["drift"][0]["component"] == "runtime_config"


def test_status_without_state_says_what_to_run(capsys, state):
    code, _, err = run(capsys, "status", "-i", EMPTY_INVENTORY, "--state-dir", str(state))
    assert code == cli.Exit.USAGE
    assert "no state for inventory" in err and "python -m runner reconcile" in err


def test_history_and_release(capsys, state):
    _seed(state)
    code, out, _ = run(
        capsys, "history", "--host", "gpu-c", "-i", EMPTY_INVENTORY, "--state-dir", str(state)
    )
    assert code == 0
    assert out.strip().endswith("gpu-c drift [runtime_config]: file /etc/x: a -> b")
    code, out, _ = run(capsys, "release", "gpu-b", "-i", EMPTY_INVENTORY, "--state-dir", str(state))
    assert (code, out.strip()) == (0, "gpu-b: released; status failed")
    code, out, _ = run(
        capsys,
        "history",
        "--kind",
        "release",
        "--json",
        "-i",
        EMPTY_INVENTORY,
        "--state-dir",
        str(state),
    )
    assert [e["host"] for e in data(out, "history")["entries"]] == ["gpu-b"]
    code, _, err = run(capsys, "release", "gpu-z", "-i", EMPTY_INVENTORY, "--state-dir", str(state))
    assert code == cli.Exit.USAGE
    assert "unknown host(s) gpu-z" in err


def test_status_and_history_of_a_node_in_pull_mode(capsys, state, monkeypatch):
    monkeypatch.delenv("GPUFLEET_INVENTORY", raising=False)
    with StateStore(state_dir_for(state, "local-n1")) as store:
        store.save(
            HostRecord("n1", status="converged"),
            [HistoryEntry(1.0, "n1", "corrective", "exporter", "1 task(s) changed")],
        )
    local = ["--local", "--node-name", "n1", "--state-dir", str(state)]
    code, out, _ = run(capsys, "status", *local)
    assert code == cli.Exit.OK
    assert out.splitlines()[1].split()[:3] == ["n1", "-", "converged"]
    code, out, _ = run(capsys, "history", *local)
    assert out.strip().endswith("n1 corrective [exporter]: 1 task(s) changed")


def test_a_plan_marks_a_disruptive_change_and_shows_its_diffs(capsys):
    outcome = HostOutcome(
        "gpu-a",
        "planned",
        reasons=["desired state changed"],
        pending=["driver"],
        disruptive=True,
        diffs={"driver": ["Predict the replacement\nwould replace driver 535.309.01"]},
    )
    report = CycleReport(started=0.0, finished=80.0, outcomes={"gpu-a": outcome}, planned=1)
    show.print_report(report, {"gpu-a": HostRecord("gpu-a", status="drifted")}, diffs=True)
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  gpu-a: planned; because desired state changed; would change driver; "
        "disruptive: rolled out in batches; now drifted",
        "    [driver] Predict the replacement",
        "      would replace driver 535.309.01",
    ]
