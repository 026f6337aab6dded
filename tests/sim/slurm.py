# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Slurm on the simulated fleet (a test fixture): Debian's own munge, slurmctld,
slurmd and slurm-client, as a site without Kubernetes runs them.

The controller (slurmctld) runs on one node, a CPU-only one like a head node; slurmd
runs on the GPU nodes. The fixture installs the packages from Debian (the nodes'
apt sources), shares one munge key made for this fleet, writes the same slurm.conf
to every node and starts the daemons. It owns slurm.conf as a site's administrator
does: gpufleet never writes it.

Each GPU node's definition in slurm.conf is what a site administrator would paste in:
the `NodeName=...` line gpufleet's slurm_gres stage rendered on that node
(/etc/gpufleet/slurm/node.conf), or, before gpufleet has run, the line `slurmd -C`
prints (the node's hardware without GPUs). Running `up` again after gpufleet is the
administrator's "paste the lines and reconfigure".

    python tests/sim/fleet.py slurm CONTROLLER NODE [NODE ...]   # start or refresh
    python tests/sim/fleet.py slurm-down                         # stop the daemons

The node names are kept in .cache/slurm/cluster.json (with the munge key) for
`slurm-down` and for the tests.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import secrets
import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

SIM_DIR = Path(__file__).resolve().parent
PROJECT = SIM_DIR.parent.parent
SLURM_DIR = Path(os.environ.get("GPUFLEET_CACHE", PROJECT / ".cache")) / "slurm"
STATE_FILE = SLURM_DIR / "cluster.json"
CLUSTER_NAME = "gpusim"
PARTITION = "gpu"
CONTROLLER_PACKAGES = ("munge", "slurmctld", "slurm-client")
NODE_PACKAGES = ("munge", "slurmd", "slurm-client")
# Where gpufleet's slurm_gres stage renders the node's slurm.conf line (the role's
# default slurm_gres_node_line_path).
GPUFLEET_NODE_LINE = "/etc/gpufleet/slurm/node.conf"
START_TIMEOUT = 60.0


class SlurmError(RuntimeError):
    pass


def _exec(
    node: str, script: str, *, stdin: str | bytes | None = None, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run(
        ["podman", "exec", "-i", node, "bash", "-euo", "pipefail", "-c", script],
        input=stdin.encode() if isinstance(stdin, str) else stdin,
        capture_output=True,
        check=False,
    )
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).decode(errors="replace").strip()
        raise SlurmError(
            f"{node}: {script.splitlines()[0]} … failed ({result.returncode}): {detail}"
        )
    return result


def run(node: str, script: str, *, check: bool = True) -> str:
    """The output of a shell script run as root on a node."""
    return _exec(node, script, check=check).stdout.decode(errors="replace")


def install(node: str, packages: Sequence[str]) -> None:
    """Install Debian's packages where they are missing, without starting anything the
    fixture has not configured (policy-rc.d refuses starts during the install)."""
    names = " ".join(packages)
    missing = run(
        node,
        f"for p in {names}; do dpkg-query -W -f='${{Status}}\\n' $p 2>/dev/null "
        "| grep -q '^install ok installed' || echo $p; done",
    ).split()
    if not missing:
        return
    _exec(
        node,
        "printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d; "
        "chmod 0755 /usr/sbin/policy-rc.d; trap 'rm -f /usr/sbin/policy-rc.d' EXIT; "
        # apt can wait forever on a mirror that stalls: bounded, and tried again.
        "for try in 1 2 3; do timeout 300 apt-get update -qq && break; done; "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        + " ".join(missing),
    )


def _write(node: str, path: str, content: bytes, mode: str, owner: str = "root:root") -> bool:
    """Write a file on a node atomically; True when its content changed."""
    digest = hashlib.sha256(content).hexdigest()
    current = run(node, f"sha256sum {shlex.quote(path)} 2>/dev/null | cut -d' ' -f1 || true")
    if current.strip() == digest:
        return False
    quoted = shlex.quote(path)
    _exec(
        node,
        f"mkdir -p $(dirname {quoted}); cat > {quoted}.new; chmod {mode} {quoted}.new; "
        f"chown {owner} {quoted}.new; mv -f {quoted}.new {quoted}",
        stdin=content,
    )
    return True


def addresses(nodes: Sequence[str]) -> dict[str, str]:
    """Each node's address on the podman network. A node keeps it across reboots, but
    its /etc/hosts does not keep what is added to it, and the network has no DNS: so
    slurm.conf gives the addresses (SlurmctldHost=name(address), NodeAddr=)."""
    found = {}
    for node in nodes:
        out = subprocess.run(
            ["podman", "inspect", "--format", "{{.NetworkSettings.IPAddress}}", node],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0 or not out.stdout.strip():
            raise SlurmError(f"{node}: not a running simulated node")
        found[node] = out.stdout.strip()
    return found


def node_line(node: str) -> str:
    """The node's definition: gpufleet's rendered line if there is one, else slurmd -C's."""
    rendered = run(node, f"cat {GPUFLEET_NODE_LINE} 2>/dev/null || true")
    for line in rendered.splitlines():
        if line.startswith("NodeName="):
            return line.strip()
    hardware = run(node, "slurmd -C").splitlines()
    if not hardware or not hardware[0].startswith("NodeName="):
        raise SlurmError(f"{node}: slurmd -C printed no NodeName line: {hardware!r}")
    return hardware[0].strip()


def with_address(line: str, address: str) -> str:
    """A NodeName line with the node's address (replacing one the line has)."""
    fields = [f for f in line.split() if not f.startswith("NodeAddr=")]
    return " ".join([fields[0], f"NodeAddr={address}", *fields[1:]])


def slurm_conf(controller: str, address: str, node_lines: Sequence[str]) -> str:
    """The fixture's slurm.conf: munge authentication, no cgroups (the nodes are
    containers), GPUs as GRES, one partition of every node."""
    settings = {
        "ClusterName": CLUSTER_NAME,
        "SlurmctldHost": f"{controller}({address})",
        "AuthType": "auth/munge",
        "SlurmUser": "slurm",
        "StateSaveLocation": "/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir": "/var/lib/slurm/slurmd",
        "SlurmctldPidFile": "/run/slurmctld.pid",
        "SlurmdPidFile": "/run/slurmd.pid",
        "SlurmctldLogFile": "/var/log/slurm/slurmctld.log",
        "SlurmdLogFile": "/var/log/slurm/slurmd.log",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none",
        "JobCompType": "jobcomp/none",
        "SchedulerType": "sched/backfill",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core",
        "MpiDefault": "none",
        # A node that was down comes back by itself once its slurmd registers again
        # (a driver change restarts nothing of Slurm's, but a reboot does).
        "ReturnToService": "2",
        "SlurmdTimeout": "60",
        "GresTypes": "gpu",
    }
    lines = ["# Written by tests/sim/slurm.py (the fixture's Slurm cluster)."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    lines += list(node_lines)
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def munge_key() -> bytes:
    """The fleet's munge key, made on first use and kept until `down`."""
    key = SLURM_DIR / "munge.key"
    if not key.is_file():
        SLURM_DIR.mkdir(parents=True, exist_ok=True)
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
    return key.read_bytes()


def sinfo(controller: str) -> dict[str, dict[str, str]]:
    """Each node's state, GRES and reason as Slurm reports them (scontrol show node)."""
    out = run(controller, "scontrol --oneliner show node", check=False)
    nodes = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            nodes[fields["NodeName"]] = fields
    return nodes


def _registered(state: str) -> bool:
    if "*" in state or "NOT_RESPONDING" in state or state == "absent":
        return False
    return not state.startswith("UNKNOWN") or "INVALID_REG" in state


def wait_registered(controller: str, nodes: Sequence[str], timeout: float = START_TIMEOUT) -> None:
    """Until slurmctld answers and each node's slurmd has registered: a state other
    than UNKNOWN, or one that says the registration was refused (INVALID_REG, e.g. fewer
    GPUs reported than slurm.conf declares), and not "not responding" (NOT_RESPONDING,
    which sinfo marks *)."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        report = sinfo(controller)
        states = {n: report.get(n, {}).get("State", "absent") for n in nodes}
        if all(_registered(s) for s in states.values()):
            return
        time.sleep(1)
    raise SlurmError(f"slurmd did not register in {timeout:.0f}s: {states}")


def up(controller: str, nodes: Sequence[str]) -> dict[str, dict[str, str]]:
    """Start or refresh the cluster; what scontrol reports for each node."""
    if controller in nodes:
        raise SlurmError(f"{controller}: the controller is not also a compute node here")
    everyone = [controller, *nodes]
    # Each node's apt at once: mostly downloads and waits, a node apiece.
    with concurrent.futures.ThreadPoolExecutor(len(everyone)) as pool:
        wanted = {n: CONTROLLER_PACKAGES if n == controller else NODE_PACKAGES for n in everyone}
        list(pool.map(install, wanted, wanted.values()))
    key = munge_key()
    entries = addresses(everyone)
    lines = [with_address(node_line(n), entries[n]) for n in nodes]
    conf = slurm_conf(controller, entries[controller], lines).encode()
    restart = {}
    for node in everyone:
        keyed = _write(node, "/etc/munge/munge.key", key, "0400", "munge:munge")
        if keyed:
            run(node, "systemctl enable -q munge; systemctl restart munge")
        else:
            run(node, "systemctl enable -q munge; systemctl start munge")
        restart[node] = _write(node, "/etc/slurm/slurm.conf", conf, "0644") or keyed
    STATE_FILE.write_text(json.dumps({"controller": controller, "nodes": list(nodes)}) + "\n")
    verb = "restart" if restart[controller] else "start"
    run(controller, f"systemctl enable -q slurmctld; systemctl {verb} slurmctld")
    for node in nodes:
        verb = "restart" if restart[node] else "start"
        run(node, f"systemctl enable -q slurmd; systemctl {verb} slurmd")
    wait_registered(controller, nodes)
    report = sinfo(controller)
    return {n: report[n] for n in nodes}


def cluster() -> dict[str, object]:
    """The running fixture's controller and nodes ({} when none)."""
    if not STATE_FILE.is_file():
        return {}
    data: dict[str, object] = json.loads(STATE_FILE.read_text())
    return data


def down() -> list[str]:
    """Stop the daemons on the nodes still there and forget the cluster."""
    state = cluster()
    stopped = []
    controller = state.get("controller")
    nodes = state.get("nodes") or []
    assert isinstance(nodes, list)
    for node, unit in [*((n, "slurmd") for n in nodes), (controller, "slurmctld")]:
        if not node:
            continue
        done = _exec(
            str(node),
            f"systemctl disable -q --now {unit}; rm -f /etc/slurm/slurm.conf",
            check=False,
        )
        if done.returncode == 0:
            stopped.append(f"{node} ({unit})")
    for name in ("munge.key", "cluster.json"):
        (SLURM_DIR / name).unlink(missing_ok=True)
    return stopped
