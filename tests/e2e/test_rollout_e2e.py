# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""A driver rollout across reconcile cycles, on three simulated T4 nodes.

The nodes start as copies of the session's onboarded T4 (conftest's bare_t4_snapshot:
onboarding is asserted there), with a state database that has never seen them, as
after a new controller took over a fleet gpufleet set up, booted as after a power cycle.
Two nodes get an older driver build, one at a time (max_parallel 1), the first of them
other exporter collectors with it; the third has its exporter stopped by hand while the
first batch applies. The loop's cycles go on while a batch applies in the background,
so they repair that drift before the first batch ends; the loop is stopped with SIGTERM
while it repairs (it finishes the batch under way and starts no other), and a restarted
reconciler finishes the second batch without planning it again.
"""

from __future__ import annotations

import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest

from test_runner_e2e import FLEET, NO_CONTAINERS, Fleet, cli_data, free_port, start_fleet

ROLLED = ["ro-1", "ro-2"]
OTHER = "ro-3"
OLDER = "535.261.03"  # Debian's older build; the nodes onboard with 535.309.01
CONTAINER_STAGES = ("toolkit", "runtime_config", "validator", "device_plugin")
COLLECTORS = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %)."
COLLECTORS_FILE = "/etc/dcgm-exporter/gpufleet-collectors.csv"

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, bare_t4_snapshot: str) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("e2e-rollout")
    nodes = dict.fromkeys([*ROLLED, OTHER], "t4-1")
    inventory = start_fleet(work, nodes, from_snapshot=bare_t4_snapshot)
    # Nodes that run no containers (a Slurm site's, say): the driver and the exporter
    # are what this module rolls and repairs.
    (inventory / "bare.yml").write_text(NO_CONTAINERS)
    try:
        yield Fleet(inventory, work / "state")
    finally:
        subprocess.run([*FLEET, "down", *ROLLED, OTHER], check=False)


def _driver(fleet: Fleet, node: str) -> str:
    query = fleet.on_node(node, "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    return query.stdout.strip()


def _events(fleet: Fleet, host: str, kind: str) -> list[dict]:
    return [e for e in fleet.history(host) if e["kind"] == kind]


def _wait_for(proc: subprocess.Popen[str], text: str, seen: list[str]) -> None:
    """Read the loop's log until a line with `text` (kept in `seen`)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return
    pytest.fail(f"the loop ended before saying {text!r}:\n{''.join(seen[-40:])}")


def test_the_copied_fleet_is_taken_over_and_converged(fleet: Fleet):
    result = fleet.reconcile("--once")
    assert result.returncode == 0, result.stdout + result.stderr
    # New to this state database, the copies are known from their own records; they
    # booted as a node does after a power cycle, with an empty /run, so the driver's
    # readiness is found missing and put back (drift), and nothing else is applied.
    for host in [*ROLLED, OTHER]:
        line = f"{host}: applied; because drift, not in the state; repaired driver; now converged"
        assert line in result.stdout, result.stdout
        [drift] = _events(fleet, host, "drift")
        assert drift["component"] == "driver", drift
    status = fleet.status()
    assert {h: r["status"] for h, r in status.items()} == dict.fromkeys(
        [*ROLLED, OTHER], "converged"
    )
    # gpufleet_containers: false - the container stages disabled and counted as passed,
    # the exporter after them serving. Neither the toolkit nor the containerd that the
    # simulated fleet's runtime_config_install asks for is installed.
    stages = status[OTHER]["stages"]
    assert [stages[s] for s in CONTAINER_STAGES] == ["disabled"] * 4, stages
    assert stages["exporter"] == "ready", stages
    for package in ("nvidia-container-toolkit", "containerd"):
        query = fleet.on_node(OTHER, "dpkg-query", "-W", "-f", "${Status}", package)
        assert "installed" not in query.stdout.split(), (package, query.stdout)


def test_drift_is_repaired_while_a_batch_applies_and_sigterm_stops_after_a_batch(fleet: Fleet):
    (fleet.inventory / "host_vars").mkdir()
    for host in ROLLED:
        (fleet.inventory / "host_vars" / f"{host}.yml").write_text(f'driver_version: "{OLDER}"\n')
    # ro-1's exporter changes with its driver: a change that alone would not disrupt
    # goes in the same batch.
    with (fleet.inventory / "host_vars" / "ro-1.yml").open("a") as host_vars:
        host_vars.write(f"exporter_collectors: |\n  {COLLECTORS}\n")
    port = free_port()
    proc = fleet.spawn("reconcile", "--interval", "10", "--metrics-port", str(port))
    seen: list[str] = []
    _wait_for(proc, "rolling out to ro-1", seen)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    # The cycle under way is counted already: the three hosts probed, and planned at
    # least the two whose driver changes.
    counted = dict(
        re.findall(r'^gpufleet_reconcile_hosts_total\{phase="(\w+)"\} (\S+)$', metrics, re.M)
    )
    assert counted["probe"] == "3.0" and float(counted["plan"]) >= 2, metrics
    stopped = fleet.on_node(OTHER, "systemctl", "stop", "nvidia-dcgm-exporter.service")
    assert stopped.returncode == 0, stopped.stderr
    _wait_for(proc, f"applying to 1 host(s): {OTHER}", seen)
    # Stopped while the repair applies: that cycle ends, the batch under way is
    # finished, and no other batch starts.
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=900)
    log = "".join(seen) + err
    assert proc.returncode == 130, out + log
    assert "SIGTERM: finishing the current batch, then stopping" in log, log
    assert "ro-1: rolled-out; changed as desired driver, exporter" in out, out
    assert [_driver(fleet, h) for h in ROLLED] == [OLDER, "535.309.01"]
    collectors = fleet.on_node("ro-1", "cat", COLLECTORS_FILE)
    assert collectors.stdout.strip() == COLLECTORS
    changed = {e["component"] for e in _events(fleet, "ro-1", "intentional")}
    assert {"driver", "exporter"} <= changed, fleet.history("ro-1")
    status = fleet.status()
    assert [status[h]["rollout_phase"] for h in ROLLED] == [None, "queued"]
    repaired = [e for e in _events(fleet, OTHER, "corrective") if e["component"] == "exporter"]
    assert repaired, (fleet.history(OTHER), out)
    first = {e["component"]: e["at"] for e in _events(fleet, "ro-1", "rollout")}
    assert list(first) == ["queued", "applying", "applied", "done"], first
    assert first["applying"] < repaired[0]["at"] < first["done"], (
        "the drift was repaired while the first batch applied"
    )
    assert "rolling out to ro-2" not in log, "one batch at a time, none after the stop"
    listed = fleet.runner("status").stdout
    assert "rollout of pool all (started" in listed and "1 done; queued 1: ro-2" in listed, listed


def test_a_restarted_reconciler_finishes_the_rollout_without_planning_again(fleet: Fleet):
    result = fleet.reconcile("--once", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = cli_data(result.stdout, "reconcile")
    assert report["planned"] == 0, "ro-2's change was planned when it joined the rollout"
    assert report["outcomes"]["ro-2"]["action"] == "rolled-out"
    assert report["rollouts"] == {"all": "2 done; finished"}
    assert [_driver(fleet, h) for h in ROLLED] == [OLDER] * 2
    phases = [e["component"] for e in _events(fleet, "ro-2", "rollout")]
    assert phases == ["queued", "applying", "applied", "done"]
    again = fleet.reconcile("--once")
    assert again.stdout.startswith("cycle: 3 probed, 0 planned, 0 applied"), again.stdout
