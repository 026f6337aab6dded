# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reconciler against real simulated nodes, through real ansible-runner.

One small fleet for the whole module (the tests run in order, each building on the
fleet the one before left): a T4 node, a CPU-only node, and an inventory host with no
node behind it. What a user would notice is asserted: exit codes, what `status` and
`history` say, which hosts a cycle touched, and the node's own state.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
FLEET = [sys.executable, str(PROJECT / "tests" / "sim" / "fleet.py")]
NODES = {"e2e-t4": "t4-1", "e2e-cpu": "none"}
GONE = "e2e-gone"
# NVIDIA's package of dcgm-exporter, and the unit it installs (the exporter stage's).
EXPORTER_PACKAGE = "datacenter-gpu-manager-exporter"
EXPORTER_UNIT = "nvidia-dcgm-exporter.service"
# gpufleet_apt_update_timeout on this fleet: the setting's least value, so that a refresh
# held by a stalled mirror is stopped soon (two tries).
APT_UPDATE_BOUND = 30
# Group variables of nodes that run no containers (a Slurm site's, say).
NO_CONTAINERS = "gpu_nodes:\n  vars:\n    gpufleet_containers: false\n"
# Long backoff: a failed host stays skipped for the rest of the module.
BACKOFF = ("--backoff-base", "3000", "--backoff-cap", "3000")
# Short backoff: a failed host is tried again by the next cycle (after a second or two).
SHORT_BACKOFF = ("--backoff-base", "1", "--backoff-cap", "1")
# What a terminal is told besides text (CSI sequences): those that move the cursor
# or erase a line end a line here, the others (colours) go.
MOVES = re.compile(r"\x1b\[[0-9;]*[ABJK]|\r")
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

pytestmark = pytest.mark.fleet


def cli_data(stdout: str, kind: str) -> Any:
    """The data of the JSON document a `--json` run printed (docs/cli.md)."""
    document = json.loads(stdout)
    assert (document["schema_version"], document["kind"]) == (1, kind), document
    return document["data"]


class Fleet:
    def __init__(self, inventory: Path, state: Path) -> None:
        self.inventory = inventory
        self.state = state

    def runner(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "runner", *args, *self._where()],
            capture_output=True,
            text=True,
            cwd=PROJECT,
            timeout=timeout,
            check=False,
        )

    def reconcile(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.runner("reconcile", *BACKOFF, *args)

    def reconcile_in_terminal(self, *args: str, timeout: float = 900) -> tuple[int, str]:
        """`reconcile` as a user runs it in a terminal: stdout and stderr on a
        pseudo-terminal of 120 columns. Its exit code and all the terminal got, with
        the escape sequences that draw and erase taken out."""
        command = [sys.executable, "-m", "runner", "reconcile", *BACKOFF, *args, *self._where()]
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color"}
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=PROJECT, env=env
        )
        os.close(slave)
        got = bytearray()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if select.select([master], [], [], 1)[0]:
                    try:
                        chunk = os.read(master, 65536)
                    except OSError:  # EIO: the program has closed the terminal
                        break
                    if not chunk:
                        break
                    got += chunk
                elif proc.poll() is not None:
                    break
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            os.close(master)
            if proc.poll() is None:
                proc.kill()
        return code, ESCAPES.sub("", MOVES.sub("\n", got.decode(errors="replace")))

    def site(self, host: str, extra_vars: dict) -> subprocess.CompletedProcess[str]:
        """One `ansible-playbook site.yml` pass on `host`, as a user runs it by hand."""
        return subprocess.run(
            [
                str(Path(sys.executable).parent / "ansible-playbook"),
                *("-i", str(self.inventory), "--limit", host),
                *("-e", json.dumps(extra_vars), "site.yml"),
            ],
            capture_output=True,
            text=True,
            cwd=PROJECT,
            env={**os.environ, "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg")},
            check=False,
        )

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "runner", *args, *self._where()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=PROJECT,
        )

    def _where(self) -> list[str]:
        return ["-i", str(self.inventory), "--state-dir", str(self.state)]

    def status(self) -> dict[str, dict]:
        result = self.runner("status", "--json")
        return {h["name"]: h for h in cli_data(result.stdout, "status")["hosts"]}

    def history(self, host: str) -> list[dict]:
        listed = self.runner("history", "--json", "--host", host, "-n", "500")
        return cli_data(listed.stdout, "history")["entries"]

    def on_node(self, node: str, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", "exec", node, *command], capture_output=True, text=True, check=False
        )

    def booted(self, node: str) -> str:
        """When the node's systemd started (PID 1's start time): a reboot changes it."""
        done = self.on_node(node, "ps", "-o", "lstart=", "-p", "1")
        assert done.returncode == 0 and done.stdout.strip(), done.stdout + done.stderr
        return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_fleet(
    work: Path, nodes: dict[str, str], from_snapshot: str = "", privileged: bool = False
) -> Path:
    """Start simulated nodes (name -> profile), from their release's image or from a
    snapshot of a node's disk (conftest's bare_t4_snapshot), privileged where they are to
    run containers themselves; returns their inventory directory (hosts.yml, and the
    simulated fleet's group_vars)."""
    inventory = work / "inventory"
    inventory.mkdir()
    add_nodes(inventory, "hosts.yml", nodes, from_snapshot, privileged)
    (inventory / "group_vars").symlink_to(PROJECT / "inventories" / "sim" / "group_vars")
    return inventory


def add_nodes(
    inventory: Path,
    hosts_file: str,
    nodes: dict[str, str],
    from_snapshot: str = "",
    privileged: bool = False,
) -> None:
    """Start simulated nodes as start_fleet does, listed in `hosts_file` of the
    inventory directory (a fleet whose nodes start from different sources)."""
    names = [arg for name, profile in nodes.items() for arg in ("--node", f"{name}={profile}")]
    source = ["--from-snapshot", from_snapshot] if from_snapshot else []
    source += ["--privileged"] if privileged else []
    hosts = str(inventory / hosts_file)
    subprocess.run([*FLEET, "up", *source, *names, "--write-inventory", hosts], check=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("e2e")
    inventory = start_fleet(work, NODES)
    # A host whose node does not exist: unreachable from the first cycle on.
    (inventory / "gone.yml").write_text(f"gpu_nodes:\n  hosts:\n    {GONE}:\n")
    # Short bounds on apt's waits, for the test that holds them up (the defaults are 120 s
    # for the locks and 300 s for a refresh).
    (inventory / "apt.yml").write_text(
        "all:\n  vars:\n"
        "    gpufleet_apt_lock_timeout: 10\n"
        f"    gpufleet_apt_update_timeout: {APT_UPDATE_BOUND}\n"
    )
    try:
        yield Fleet(inventory, work / "state")
    finally:
        subprocess.run([*FLEET, "down", *NODES], check=False)


def test_first_cycle_converges_the_fleet_and_the_unreachable_host_backs_off(fleet: Fleet):
    # In a terminal, as a new user first runs it: a live row per host at its stage.
    code, screen = fleet.reconcile_in_terminal("--once")
    assert code == 1, screen
    rows = [line.split() for line in screen.splitlines()]
    assert any(row[:3] == ["e2e-t4", "driver", "(1/8)"] for row in rows), screen
    # Planned without a failure: on new nodes, whose apt lists no stage has fetched yet
    # in check mode, the runtime's packages are predicted, not looked for (and tried
    # again) in vain.
    planned = r"plan: 2 of 2 hosts through \(\d+:\d\d\); successful\s*$"
    assert re.search(planned, screen, re.M), screen
    assert re.search(r"^apply: 0 of 2 hosts through \(0:0\d\)\s*$", screen, re.M), screen
    ended = r"apply: 2 of 2 hosts through \(\d+:\d\d\); successful\s*$"
    assert re.search(ended, screen, re.M), screen
    # The cycle's summary comes once the table is gone.
    assert screen.rindex("cycle: 3 probed") > screen.rindex("apply: 2 of 2 hosts through")
    status = fleet.status()
    assert status["e2e-t4"]["status"] == "converged", screen
    assert set(status["e2e-t4"]["stages"].values()) == {"ready", "disabled"}
    assert status["e2e-t4"]["stages"]["mig"] == "disabled"  # no mig_config: MIG left alone
    assert status["e2e-cpu"]["status"] == "not-a-gpu-node"
    gone = status[GONE]
    assert (gone["status"], gone["consecutive_failures"]) == ("unreachable", 1)
    assert gone["next_attempt"] > time.time() + 2000
    first = [e["kind"] for e in fleet.history("e2e-t4")]
    assert set(first) == {"intentional"}, "a first apply is intentional, never a repair"


def test_steady_state_only_probes_and_skips_the_host_backing_off(fleet: Fleet):
    result = fleet.reconcile("--once")
    assert result.stdout.startswith("cycle: 2 probed, 0 planned, 0 applied"), result.stdout
    assert f"{GONE}: skipped; backing off" in result.stdout
    assert result.returncode == 1, "the fleet still has an unreachable host"


PROMETHEUS = PROJECT / ".cache" / "consumers" / "usr" / "bin" / "prometheus"
RULES = PROJECT / "roles" / "k8s_manifests" / "files" / "monitoring" / "gpufleet-rules.yml"
DASHBOARD = PROJECT / "roles" / "k8s_manifests" / "files" / "monitoring" / "gpufleet-dashboard.json"


def _prometheus_api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=10) as answer:
        return json.load(answer)["data"]


def test_a_real_prometheus_scrapes_the_fleet_loads_the_rules_and_an_alert_fires(
    fleet: Fleet, tmp_path: Path
):
    """Debian's Prometheus scrapes the reconciler and the T4's dcgm-exporter, with the
    shipped rules (their `for:` cut to a second, the expressions as shipped): every
    rule evaluates, and the host that never answers raises GpufleetNodeNotConverged."""
    assert PROMETHEUS.is_file(), "run tests/tools/consumers.sh (make e2e does)"
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    node_ip = subprocess.run(
        ["podman", "inspect", "-f", "{{.NetworkSettings.IPAddress}}", "e2e-t4"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    metrics_port, prometheus_port = free_port(), free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [
            {
                "job_name": "gpufleet",
                "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
            },
            {"job_name": "dcgm-exporter", "static_configs": [{"targets": [f"{node_ip}:9400"]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    reconciler = fleet.spawn(
        "reconcile",
        "--backoff-base",
        "3000",
        "--interval",
        "600",
        "--metrics-port",
        str(metrics_port),
    )
    with (tmp_path / "prometheus.log").open("w") as log:
        prometheus = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        firing: list[dict] = []
        while time.monotonic() < deadline:
            time.sleep(2)
            try:
                alerts = _prometheus_api(prometheus_port, "alerts")["alerts"]
            except OSError:
                continue  # not listening yet
            firing = [
                a["labels"]
                for a in alerts
                if a["state"] == "firing" and a["labels"]["alertname"] == "GpufleetNodeNotConverged"
            ]
            if firing:
                break
        log = (tmp_path / "prometheus.log").read_text()
        assert firing == [
            {
                "alertname": "GpufleetNodeNotConverged",
                "host": GONE,
                "status": "unreachable",
                "severity": "warning",
            }
        ], log
        targets = _prometheus_api(prometheus_port, "targets")["activeTargets"]
        assert {t["labels"]["job"]: t["health"] for t in targets} == {
            "gpufleet": "up",
            "dcgm-exporter": "up",
        }, targets
        groups = _prometheus_api(prometheus_port, "rules")["groups"]
        health = {r["name"]: r["health"] for g in groups for r in g["rules"]}
        shipped = {r.get("alert") or r.get("record") for g in rules["groups"] for r in g["rules"]}
        assert set(health) == shipped and set(health.values()) == {"ok"}, health
        utilisation = _prometheus_api(prometheus_port, "query?query=DCGM_FI_DEV_GPU_UTIL")
        assert utilisation["result"], "no GPU metric from the node's exporter"
        ready = _prometheus_api(prometheus_port, "query?query=gpu_operator_node_driver_ready")
        assert {r["metric"]["node"]: r["value"][1] for r in ready["result"]} == {"e2e-t4": "1"}
        # The dashboard's queries, with Grafana's variables as "All" would set them.
        answered = {}
        for panel in json.loads(DASHBOARD.read_text())["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$job", ".+").replace("$instance", ".+")
                expr = expr.replace("$__rate_interval", "1m")
                query = urllib.parse.urlencode({"query": expr})
                answered[panel["title"]] = bool(
                    _prometheus_api(prometheus_port, f"query?{query}")["result"]
                )
        for title in (
            "Hosts converged",
            "Hosts by status",
            "Stage readiness",
            "Remediation held by the breaker",
            "GPU utilisation",
        ):
            assert answered[title], f"dashboard panel {title!r} has no data"
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=60)
        reconciler.send_signal(signal.SIGTERM)
        reconciler.communicate(timeout=300)


# Wrong values a new user tried, of early and late stages alike (issue 18): each stops
# site.yml in its first play, before any node is touched, naming host and variable.
WRONG_SETTINGS = [
    {"toolkit_version": "1.17.8-1; reboot"},
    {"toolkit_repo_channel": "nightly"},
    {"runtime_config_runtimes": ["podman"]},
    {"driver_reboot_timeout": -5},
    {"driver_cuda_repo_base_url": "not a url; rm -rf /"},
    {"driver_debian_mirror": "ftp://mirror example/debian"},
    {"k8s_manifests_namespace": "GPU Fleet"},
    {"k8s_manifests_image_pull_policy": "Sometimes"},
    {"k8s_manifests_tolerations": [{"key": "nvidia.com/gpu", "effect": "Sometimes"}]},
    {"device_plugin_mode": "host"},
    {"exporter_port": 70000},
    {"mig_config": "all-balanced; reboot"},
    # Refused only when their stage started, after the stages before it (issue 44): a
    # number where the collectors CSV goes, a boolean as a string, a version of another
    # branch than the one named, a MIG layout the file does not have.
    {"exporter_collectors": 42},
    {"k8s_manifests_apply": "true"},
    {"driver_version": "550.163.01", "driver_branch": "535"},
    {"mig_config": "all-halves"},
]


def _node_snapshot(fleet: Fleet, node: str) -> str:
    """Every file under the paths the stages write, with size and mtime, and the units."""
    listing = fleet.on_node(
        node,
        "sh",
        "-c",
        "find /etc /usr /opt /var/lib/dpkg /var/lib/gpufleet /run/nvidia -xdev "
        "-printf '%p %s %T@\\n' 2>/dev/null | sort | sha256sum; "
        "systemctl list-units --no-legend --plain --state=active | sha256sum",
    )
    assert listing.returncode == 0, listing.stderr
    return listing.stdout


def test_wrong_settings_are_refused_before_any_node_is_touched(fleet: Fleet):
    before = _node_snapshot(fleet, "e2e-t4")
    for wrong in WRONG_SETTINGS:
        name = next(iter(wrong))  # the variable refused
        run = fleet.site("e2e-t4", wrong)
        out = run.stdout + run.stderr
        assert run.returncode != 0, wrong
        assert "Settings of e2e-t4 refused before any change" in out, out
        assert name in out, out
        assert "Discover the node's GPUs" not in out, "a play after the check ran"
        assert "Traceback" not in out
    assert _node_snapshot(fleet, "e2e-t4") == before

    # The reconciler leaves a host with a wrong setting alone (no probe, no change, no
    # backoff) and goes on with the others; fixed, the host is back as it was.
    host_vars = fleet.inventory / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / "e2e-t4.yml").write_text('toolkit_version: "latest"\n')
    result = fleet.reconcile("--once")
    assert result.returncode == 1
    assert "e2e-t4: failed; settings refused, node left alone: " in result.stdout, result.stdout
    assert "toolkit_version: expected a toolkit version" in result.stdout
    assert "e2e-cpu: probed" in result.stdout
    status = fleet.status()["e2e-t4"]
    assert (status["status"], status["consecutive_failures"]) == ("refused", 0)
    (host_vars / "e2e-t4.yml").unlink()
    result = fleet.reconcile("--once")
    assert "e2e-t4: probed" in result.stdout, result.stdout
    assert fleet.status()["e2e-t4"]["status"] == "converged"
    assert _node_snapshot(fleet, "e2e-t4") == before


def test_a_repository_key_that_is_not_pinned_is_refused_before_apt_trusts_it(fleet: Fleet):
    # As if the repository now served another key than the one pinned: the pin names a
    # key the file does not hold.
    keyring = "/etc/apt/keyrings/nvidia-container-toolkit.asc"
    apt_state = (
        f"sha256sum {keyring}; ls -l --time-style=full-iso /etc/apt/sources.list.d "
        "/etc/apt/keyrings; dpkg-query -W"
    )
    before = fleet.on_node("e2e-t4", "sh", "-c", apt_state)
    assert before.returncode == 0, before.stderr
    served = fleet.on_node("e2e-t4", "cat", keyring).stdout
    other = "0123456789ABCDEF0123456789ABCDEF01234567"
    run = fleet.site("e2e-t4", {"toolkit_repo_key_fingerprints": [other]})
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert "which toolkit_repo_key_fingerprints does not pin" in out, out
    assert f"it pins {other}" in out and f"{keyring} was not changed" in out
    assert served.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert fleet.on_node("e2e-t4", "sh", "-c", apt_state).stdout == before.stdout
    # With the right pin again, the next cycle finds the node as it was.
    result = fleet.reconcile("--once")
    assert fleet.status()["e2e-t4"]["status"] == "converged", result.stdout


def test_injected_drift_is_repaired_on_that_node_only(fleet: Fleet):
    cpu_before = fleet.history("e2e-cpu")
    stopped = fleet.on_node("e2e-t4", "systemctl", "stop", EXPORTER_UNIT)
    assert stopped.returncode == 0, stopped.stderr
    result = fleet.reconcile("--once")
    assert "e2e-t4: applied; because drift; repaired exporter" in result.stdout, result.stdout
    assert "e2e-cpu: probed" in result.stdout
    active = fleet.on_node("e2e-t4", "systemctl", "is-active", EXPORTER_UNIT)
    assert active.stdout.strip() == "active"
    kinds = [(e["kind"], e["component"]) for e in fleet.history("e2e-t4")]
    assert ("drift", "exporter") in kinds
    assert kinds[-1] == ("corrective", "exporter")
    assert fleet.history("e2e-cpu") == cpu_before, "the healthy node was not touched"
    assert fleet.status()["e2e-t4"]["status"] == "converged"


def inject_fault(node: str, *args: str) -> None:
    done = subprocess.run([*FLEET, "fault", node, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_gpu_fault_asking_a_reset_is_remediated_and_its_xid_recorded_once(fleet: Fleet):
    """A double-bit ECC error on the T4 (the simulated board's counters and the driver's
    Xid 48 in the node's kernel log): the probe reads it through Debian's nvidia-smi and
    /dev/kmsg and it asks for a GPU reset. The reconciler takes the node out of service,
    stops its GPU services (DCGM's host engine holds the GPU: the driver refuses to reset
    a GPU another process holds), runs Debian's `nvidia-smi --gpu-reset`, starts the
    services again, applies, reads the GPU again and returns the node, without a reboot.
    The Xid counts once."""
    booted = fleet.booted("e2e-t4")
    inject_fault("e2e-t4", "ecc-dbe", "--gpu", "0")
    result = fleet.reconcile("--once")
    said = next((ln for ln in result.stdout.splitlines() if "e2e-t4:" in ln), result.stdout)
    assert said.startswith("  e2e-t4: rolled-out; because GPU reset owed; "), result.stdout
    assert "remediated by a GPU reset; health check passed" in said, said
    assert fleet.booted("e2e-t4") == booted, "the node was rebooted"
    for service in ("nvidia-dcgm", "nvidia-dcgm-exporter"):
        active = fleet.on_node("e2e-t4", "systemctl", "is-active", service)
        assert active.stdout.strip() == "active", f"{service} was not started again"
    t4 = fleet.status()["e2e-t4"]
    assert (t4["status"], t4["rollout_phase"], t4["remedy"]) == ("converged", None, {})
    assert t4["health"] == {"action": "none", "gpus": {}}
    entries = [e for e in fleet.history("e2e-t4") if e["kind"] in ("health", "rollout")]
    assert [e["component"] for e in entries[-9:]] == [
        *("xid", "gpu", "remedy"),  # read, and owed
        *("queued", "applying"),  # out of service, reset, apply
        *("gpu", "remedy"),  # read again: no signal
        *("applied", "done"),  # back in service
    ], entries
    xid, _, owed, queued, applying, cleared, remedied, *_ = (e["summary"] for e in entries[-9:])
    address = xid.split()[4]
    assert xid.startswith(f"Xid 48 on GPU {address} asks reset")
    # (the double-bit count itself is watched; the page it left to retire and the Xid
    # ask for the reset)
    assert owed.startswith(f"remediation owed: reset asked (GPU {address}: retire-pending: ")
    assert owed.endswith(", Xid 48 (double-bit ECC error))"), owed
    assert queued.startswith("GPU remediation owed: reset asked")
    assert applying == "out of service; its GPUs' reset, then change applying"
    assert cleared == f"GPU {address}: no signal any more"
    assert remedied == "remediated by a GPU reset; health check passed"

    result = fleet.reconcile("--once")
    assert "e2e-t4: probed" in result.stdout, result.stdout
    entries = [e for e in fleet.history("e2e-t4") if e["kind"] == "health"]
    assert [e["component"] for e in entries].count("xid") == 1, "an Xid counts once"

    # An application's error (Xid 13) asks for no action: recorded, nothing more.
    inject_fault("e2e-t4", "xid", "--gpu", "0", "--code", "13")
    result = fleet.reconcile("--once")
    assert "e2e-t4: probed" in result.stdout, result.stdout
    last = fleet.history("e2e-t4")[-1]
    assert (last["kind"], last["component"]) == ("health", "xid"), last
    assert last["summary"].startswith(f"Xid 13 on GPU {address} asks none"), last
    assert fleet.status()["e2e-t4"]["remedy"] == {}


def test_a_sources_file_mangled_by_hand_is_repaired_and_apt_works_again(fleet: Fleet):
    """A sources file of ours broken by hand breaks apt on the node; the reconciler
    must not wait on apt to repair it. (Here the plan predicts the rewrite; a plan
    that fails on such drift is applied anyway: test_runner_loop.)"""
    find = fleet.on_node(
        "e2e-t4",
        "python3",
        "-c",
        "import json; r = json.load(open('/var/lib/gpufleet/applied.json'));"
        "print(next(f for f in sorted(r['components']['driver']['files'])"
        " if f.endswith('.sources')))",
    )
    assert find.returncode == 0, find.stderr
    sources = find.stdout.strip()
    before = fleet.on_node("e2e-t4", "cat", sources).stdout
    fleet.on_node(
        "e2e-t4", "sh", "-c", f"echo 'Types: deb\nURIs: ftp://mirror example' > {sources}"
    )
    assert fleet.on_node("e2e-t4", "apt-get", "update").returncode != 0, "apt is broken"
    result = fleet.reconcile("--once")
    assert "e2e-t4: applied; because drift; repaired driver" in result.stdout, result.stdout
    assert fleet.on_node("e2e-t4", "cat", sources).stdout == before
    assert fleet.on_node("e2e-t4", "apt-get", "update").returncode == 0
    assert fleet.status()["e2e-t4"]["status"] == "converged"


def test_a_lost_state_database_is_relearnt_from_the_nodes_records_without_a_change(
    fleet: Fleet,
):
    """The state directory gone (a new controller, a lost disk): the nodes' own records
    say gpufleet converged them, so they are planned, not applied as if new (a
    disruptive change would still go through a rollout: test_runner_loop), and with
    nothing to change the state is rebuilt and nothing on them changes."""
    before = {node: _node_snapshot(fleet, node) for node in ("e2e-t4", "e2e-cpu")}
    statuses = {node: fleet.status()[node]["status"] for node in before}
    shutil.rmtree(fleet.state)
    result = fleet.reconcile("--once")
    assert "Traceback" not in result.stderr
    # (the third is the host that never answers)
    assert result.stdout.startswith("cycle: 3 probed, 2 planned, 0 applied"), result.stdout
    assert "e2e-t4: planned; because not in the state; now converged" in result.stdout
    assert {node: fleet.status()[node]["status"] for node in before} == statuses
    assert {node: _node_snapshot(fleet, node) for node in before} == before
    result = fleet.reconcile("--once")
    assert result.stdout.startswith("cycle: 2 probed, 0 planned, 0 applied"), result.stdout


def test_second_reconciler_is_refused_while_one_runs(fleet: Fleet):
    first = fleet.spawn(
        "reconcile", "--backoff-base", "3000", "--interval", "600", "--metrics-port", "0"
    )
    assert first.stderr is not None
    try:
        for line in first.stderr:
            if "probing" in line:  # the first holds the lock from before its probe
                break
        second = fleet.runner("reconcile", "--once", timeout=60)  # refused at once
        assert second.returncode == 3, second.stdout + second.stderr
        assert "another reconciler (pid " in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=300)
    assert first.returncode == 130


def test_an_apply_cut_short_twice_leaves_the_state_whole_and_the_next_attempt_finishes_it(
    fleet: Fleet,
):
    """A change to the T4 (new exporter collectors) whose apply is cut short twice.
    First SIGKILL to the whole reconciler service (as systemd's kill of its cgroup):
    the state database reads, and the next reconciler takes the lock at once. Then the
    node powers off (its container stopped at once) in the middle of that reconciler's
    apply: the cycle ends with the host unreachable and its state whole. Once the node
    is back, the next attempt finishes the change."""
    collectors = "DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB)."
    host_vars = fleet.inventory / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / "e2e-t4.yml").write_text(f"exporter_collectors: |\n  {collectors}\n")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "runner", "reconcile", "--interval", "600"),
            *("--metrics-port", "0", "--backoff-base", "3000", *fleet._where()),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=PROJECT,
        start_new_session=True,
    )
    _until_applying(proc, "e2e-t4")
    os.killpg(proc.pid, signal.SIGKILL)
    # ansible-runner starts ansible-playbook in a session of its own; systemd's kill of
    # the service's cgroup ends it too, so it is killed here as well (left, it lingers
    # on a node connection long after the test).
    subprocess.run(["pkill", "-KILL", "-f", f"-i {fleet.inventory} "], check=False)
    proc.wait(timeout=30)
    status = fleet.runner("status")
    assert "Traceback" not in status.stderr and "e2e-t4" in status.stdout, status.stderr

    resumed = fleet.spawn("reconcile", "--once", *SHORT_BACKOFF)
    _until_applying(resumed, "e2e-t4")  # (refused the lock, it would exit 3 at once)
    subprocess.run(["podman", "stop", "--time", "0", "e2e-t4"], check=True, capture_output=True)
    out, err = resumed.communicate(timeout=600)
    assert "Traceback" not in err
    assert "e2e-t4: failed" in out and "unreachable" in out, out + err
    status = fleet.status()["e2e-t4"]
    assert (status["status"], status["consecutive_failures"]) == ("unreachable", 1), status
    subprocess.run(["podman", "start", "e2e-t4"], check=True, capture_output=True)
    # Until its boot is over (the connection is sshd started per session).
    subprocess.run([*FLEET, "wait", "e2e-t4"], check=True)
    result = fleet.reconcile("--once", *SHORT_BACKOFF)
    assert result.returncode == 1, result.stdout + result.stderr  # only e2e-gone is unwell
    assert "e2e-t4: applied" in result.stdout, result.stdout
    on_node = fleet.on_node("e2e-t4", "cat", "/etc/dcgm-exporter/gpufleet-collectors.csv")
    assert on_node.stdout.strip() == collectors
    assert fleet.status()["e2e-t4"]["status"] == "converged"
    result = fleet.reconcile("--once")
    assert "probed, 0 planned, 0 applied" in result.stdout.splitlines()[0], result.stdout
    (host_vars / "e2e-t4.yml").unlink()


def _until_applying(proc: subprocess.Popen[str], host: str) -> None:
    """Read a reconciler's progress until it applies to `host`, then give its
    ansible-playbook time to be at work on the node."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if f"applying to 1 host(s): {host}" in line:
            break
    time.sleep(5)  # inside ansible-playbook's run on the node


# A mirror that accepts a request and never answers (apt then waits on it for good):
# a listening socket on the node that no one reads, apt's proxy for http sources.
STALLED_MIRROR = (
    "import socket\n"
    "server = socket.create_server(('127.0.0.1', 3128))\n"
    "held = []\n"
    "while True:\n"
    "    held.append(server.accept())\n"
)
STALL_CONF = "/etc/apt/apt.conf.d/99e2e-stalled-mirror"


def test_apt_held_by_a_lock_then_by_a_stalled_mirror_fails_naming_each_then_is_repaired(
    fleet: Fleet,
):
    """dcgm-exporter removed, and apt held up twice before it can be put back. First
    another program (an unattended upgrade, an administrator's apt) holds dpkg's lock:
    the install waits gpufleet_apt_lock_timeout, fails naming the lock and its holder,
    and the host backs off without quarantine. Then, the lock free, apt's lists of the
    repository that carries the package are gone and the refresh that would fetch them
    is held by a mirror that never answers: it is stopped at gpufleet_apt_update_timeout
    and tried once more, and the stage fails saying so, instead of the cycle waiting for
    good. The sources file is unchanged all along, so only apt's own view (no version of
    the package offered) tells the next cycle, once the mirror answers, to fetch the
    lists; it does, and installs the package. Last in the module: its short backoff lets
    the host that never answers be tried again, which the cycles of the tests before do
    not expect. (Both bounds are the fleet's settings from its start: a setting changed
    here would have every host planned again.)"""
    removed = fleet.on_node("e2e-t4", "dpkg", "--remove", EXPORTER_PACKAGE)
    assert removed.returncode == 0, removed.stderr
    short = (*SHORT_BACKOFF, "--once")
    holder = (
        "import fcntl, time\n"
        "lock = open('/var/lib/dpkg/lock-frontend', 'w')\n"
        "fcntl.lockf(lock, fcntl.LOCK_EX)\n"
        "time.sleep(900)\n"
    )
    held = subprocess.run(["podman", "exec", "-d", "e2e-t4", "python3", "-c", holder], check=False)
    assert held.returncode == 0
    try:
        result = fleet.reconcile(*short)
        out = result.stdout + result.stderr
        assert "e2e-t4: failed" in result.stdout, out
        assert "Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend)" in out, out
        status = fleet.status()["e2e-t4"]
        assert status["status"] == "failed" and not status["quarantined"], status
    finally:
        fleet.on_node("e2e-t4", "pkill", "-f", "fcntl.lockf")

    lists = "/var/lib/apt/lists/_srv_gpufleet-repo_cuda_*"  # the local CUDA repository's
    dropped = fleet.on_node("e2e-t4", "sh", "-c", f"rm -v {lists}")
    assert "removed" in dropped.stdout, dropped.stderr
    policy = fleet.on_node("e2e-t4", "apt-cache", "policy", EXPORTER_PACKAGE).stdout
    assert "Candidate: (none)" in policy, policy  # apt-get install would find nothing
    stall = subprocess.run(
        ["podman", "exec", "-d", "e2e-t4", "python3", "-c", STALLED_MIRROR], check=False
    )
    assert stall.returncode == 0
    proxy = f"echo 'Acquire::http::Proxy \"http://127.0.0.1:3128\";' > {STALL_CONF}"
    assert fleet.on_node("e2e-t4", "sh", "-c", proxy).returncode == 0
    time.sleep(3)  # past the backoff
    try:
        # (A refresh apt would never end fails the run's own time limit instead.)
        result = fleet.runner("reconcile", *short, timeout=600)
        out = result.stdout + result.stderr
        assert "e2e-t4: failed" in result.stdout, out
        bound = f"each try stopped past gpufleet_apt_update_timeout (seconds) {APT_UPDATE_BOUND}"
        assert bound + ": Timeout exceeded" in out, out
    finally:
        fleet.on_node("e2e-t4", "pkill", "-f", "socket.create_server")
        fleet.on_node("e2e-t4", "rm", "-f", STALL_CONF)

    time.sleep(3)  # past the backoff
    result = fleet.reconcile(*short)
    assert "e2e-t4: applied; because drift" in result.stdout, result.stdout
    policy = fleet.on_node("e2e-t4", "apt-cache", "policy", EXPORTER_PACKAGE).stdout
    assert "Candidate: (none)" not in policy, policy
    installed = fleet.on_node("e2e-t4", "dpkg-query", "-W", "-f=${Status}", EXPORTER_PACKAGE)
    assert installed.stdout == "install ok installed"
    active = fleet.on_node("e2e-t4", "systemctl", "is-active", EXPORTER_UNIT)
    assert active.stdout.strip() == "active"
    assert fleet.status()["e2e-t4"]["status"] == "converged"


# -- pull mode ----------------------------------------------------------------------


def _wheelhouse() -> Path:
    """Wheels of the package's pinned dependencies, its build backend and pip, for an
    offline install on a node (kept per pyproject.toml under .cache/pullmode)."""
    pyproject = PROJECT / "pyproject.toml"
    key = hashlib.sha256(pyproject.read_bytes()).hexdigest()[:12]
    wheels = PROJECT / ".cache" / "pullmode" / f"wheels-{key}"
    if (wheels / ".complete").exists():
        return wheels
    project = tomllib.loads(pyproject.read_text())
    wanted = [*project["project"]["dependencies"], *project["build-system"]["requires"], "pip"]
    # A directory of this process's own (two parts of `make test` may both get here),
    # renamed into place whole; whichever process renames first is kept.
    wheels.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{wheels.name}.", dir=wheels.parent))
    partial.chmod(0o755)  # as the directory it replaces was made
    download = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
    try:
        subprocess.run([*download, "--dest", str(partial), *wanted], check=True)
        (partial / ".complete").touch()
        with contextlib.suppress(OSError):  # another process's is there now, whole
            partial.rename(wheels)
    finally:  # (gone once renamed; a failed or interrupted download leaves nothing)
        shutil.rmtree(partial, ignore_errors=True)
    return wheels


def _copy_to_node(node: str, source: Path, target: str, *exclude: str) -> None:
    """`source`'s contents into `target` on the node (symlinks followed)."""
    excluded = [f"--exclude=./{name}" for name in exclude]
    pack = subprocess.Popen(
        ["tar", "-c", "-h", *excluded, "-C", str(source), "."], stdout=subprocess.PIPE
    )
    unpack = subprocess.run(
        ["podman", "exec", "-i", node, "sh", "-c", f"mkdir -p {target} && tar -x -C {target}"],
        stdin=pack.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    assert pack.wait() == 0 and unpack.returncode == 0, unpack.stderr


def _last_run(fleet: Fleet, node: str) -> tuple[str, str]:
    """When the pull-mode service's last run started, and whether it is over."""
    shown = fleet.on_node(
        node,
        "systemctl",
        "show",
        "-p",
        "ExecMainStartTimestampMonotonic",
        "-p",
        "ActiveState",
        "gpufleet-reconcile.service",
    )
    values = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    return values.get("ExecMainStartTimestampMonotonic", ""), values.get("ActiveState", "")


def test_pull_mode_the_node_converges_itself_through_the_shipped_units(fleet: Fleet):
    """The package installed on the T4 from the checkout, as the unit's comment says (an
    offline index stands in for PyPI), the shipped service and timer installed: the
    service's run takes the node into its own state; a drift injected after it is
    repaired by the timer's run; `runner status --local` on the node says so."""
    node = "e2e-t4"
    _copy_to_node(node, PROJECT, "/opt/gpufleet", ".venv", ".cache", ".git", "out")
    wheels = _wheelhouse()
    _copy_to_node(node, wheels, "/tmp/gpufleet-wheels")
    pip = next(wheels.glob("pip-*.whl")).name
    install = fleet.on_node(
        node,
        "sh",
        "-c",
        "python3 -m venv --without-pip /opt/gpufleet/.venv && "
        f"/opt/gpufleet/.venv/bin/python /tmp/gpufleet-wheels/{pip}/pip install -q "
        "--no-index --find-links /tmp/gpufleet-wheels --no-compile pip /opt/gpufleet",
    )
    assert install.returncode == 0, install.stdout + install.stderr
    _copy_to_node(node, fleet.inventory, "/etc/gpufleet/inventory")
    setup = fleet.on_node(
        node,
        "sh",
        "-c",
        "echo GPUFLEET_INVENTORY=/etc/gpufleet/inventory > /etc/default/gpufleet-reconcile && "
        "cp /opt/gpufleet/src/runner/systemd/gpufleet-reconcile.* /etc/systemd/system/ && "
        # The timer's first run comes 5 min after boot (a container's start), spread
        # by up to 5 min for a fleet: a test's one node runs at once instead.
        "mkdir -p /etc/systemd/system/gpufleet-reconcile.timer.d && "
        "printf '[Timer]\\nOnActiveSec=1s\\nRandomizedDelaySec=0\\n' "
        "> /etc/systemd/system/gpufleet-reconcile.timer.d/test.conf && "
        "systemctl daemon-reload",
    )
    assert setup.returncode == 0, setup.stderr
    local = (
        "set -a && . /etc/default/gpufleet-reconcile && GPUFLEET_STATE_DIR=/var/lib/gpufleet-runner"
        " /opt/gpufleet/.venv/bin/python -m runner"
    )

    started = fleet.on_node(node, "systemctl", "start", "gpufleet-reconcile.service")
    journal = fleet.on_node(node, "journalctl", "-u", "gpufleet-reconcile", "--no-pager")
    assert started.returncode == 0, started.stderr + journal.stdout[-3000:]
    status = fleet.on_node(node, "sh", "-c", f"{local} status --local --json")
    record = {h["name"]: h for h in cli_data(status.stdout, "status")["hosts"]}[node]
    assert record["status"] == "converged", record

    before, _ = _last_run(fleet, node)
    stopped = fleet.on_node(node, "systemctl", "stop", EXPORTER_UNIT)
    assert stopped.returncode == 0
    timer = fleet.on_node(node, "systemctl", "start", "gpufleet-reconcile.timer")
    assert timer.returncode == 0, timer.stderr
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        started_at, state = _last_run(fleet, node)
        if started_at != before and state in ("inactive", "failed"):
            break
        time.sleep(5)
    triggered = fleet.on_node(
        node, "systemctl", "show", "-p", "LastTriggerUSec", "--value", "gpufleet-reconcile.timer"
    )
    fleet.on_node(node, "systemctl", "stop", "gpufleet-reconcile.timer")
    journal = fleet.on_node(node, "journalctl", "-u", "gpufleet-reconcile", "--no-pager")
    assert started_at != before and state == "inactive", journal.stdout[-3000:]
    assert triggered.stdout.strip() not in ("", "n/a"), "the timer started the run"
    active = fleet.on_node(node, "systemctl", "is-active", EXPORTER_UNIT)
    assert active.stdout.strip() == "active", journal.stdout[-3000:]
    listed = fleet.on_node(node, "sh", "-c", f"{local} status --local")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert node in listed.stdout and "converged" in listed.stdout, listed.stdout
    history = fleet.on_node(node, "sh", "-c", f"{local} history --local --json")
    kinds = [(e["kind"], e["component"]) for e in cli_data(history.stdout, "history")["entries"]]
    assert ("corrective", "exporter") in kinds, kinds


# -- an installed controller at a site ----------------------------------------------


def installed_controller(work: Path) -> Path:
    """gpufleet's wheel, built from the checkout, installed offline into a new
    virtualenv under `work`; returns the virtualenv."""
    wheels = _wheelhouse()  # the pinned dependencies, offline
    offline = ["--no-index", "--find-links", str(wheels)]
    dist, venv = work / "dist", work / "venv"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *offline]
    subprocess.run([*pip_wheel, "-w", str(dist), str(PROJECT)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (wheel,) = dist.glob("gpufleet-*.whl")
    install = [str(venv / "bin" / "pip"), "install", "-q", "--no-compile", *offline, str(wheel)]
    subprocess.run(install, check=True)
    # Bytecode for all but the collections bundled with `ansible` (15,000 files): Ansible
    # loads collection code through its own loader, which compiles the source each time
    # and never reads a .pyc; byte-compiling them was more than half of the install.
    compileall = [str(venv / "bin" / "python"), "-m", "compileall", "-q"]
    subprocess.run(
        [*compileall, "-x", "/ansible_collections/", str(venv / "lib")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return venv


def site_directory(
    site: Path, venv: Path, fleet_inventory: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """A site's directory: its inventory (the fleet's nodes, with their group_vars, and
    a web server with no node behind it) and its own ansible.cfg (logging to
    ansible.log there). Returns a function that runs the installed `gpufleet` there,
    with none of the checkout's Ansible settings or virtualenv in its environment."""
    (site / "inventory").mkdir(parents=True)
    hosts = yaml.safe_load((fleet_inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["web"] = {"hosts": {"web-1": {"ansible_host": "192.0.2.10"}}}
    (site / "inventory" / "hosts.yml").write_text(yaml.safe_dump(hosts))
    shutil.copytree(fleet_inventory / "group_vars", site / "inventory" / "group_vars")
    (site / "ansible.cfg").write_text("[defaults]\nlog_path = ansible.log\n")
    ours = str(PROJECT / ".venv")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANSIBLE_", "GPUFLEET_")) and k != "PYTHONPATH"
    }
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ours not in p)

    def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(venv / "bin" / "gpufleet"), *args]
        return subprocess.run(
            command, cwd=site, env=env, capture_output=True, text=True, timeout=1500, check=False
        )

    return gpufleet


def test_an_installed_controller_runs_from_a_site_with_the_sites_own_ansible(
    fleet: Fleet, installed_gpufleet: Path, tmp_path: Path
):
    """gpufleet installed from its wheel into a virtualenv of its own, run from a
    directory holding only the site's inventory and ansible.cfg, no checkout in
    sight: the playbooks are the package's, Ansible logs where the site's ansible.cfg
    says, the fleet's bastion-like ProxyCommand works from inventory variables alone,
    and a web server in the site's inventory (no node behind it) is never contacted."""
    venv, site = installed_gpufleet, tmp_path / "site"
    gpufleet = site_directory(site, venv, fleet.inventory)

    version = gpufleet("version")
    assert version.returncode == 0, version.stderr
    assert f"playbooks: {venv}" in version.stdout, version.stdout
    assert version.stdout.rstrip().endswith("(installed package)"), version.stdout

    where = ["-i", "inventory", "--state-dir", "state"]
    plan = gpufleet("plan", *where)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    status = gpufleet("status", "--json", *where)
    assert sorted(h["name"] for h in cli_data(status.stdout, "status")["hosts"]) == sorted(NODES)
    log = (site / "ansible.log").read_text()
    assert "Probe each node for drift from its last successful apply" in log
    assert "e2e-t4" in log and "web-1" not in log and "192.0.2.10" not in log
