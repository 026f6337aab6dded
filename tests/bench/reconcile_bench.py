# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark: the reconciler's steady-state sweep against Ansible's own drift checks.

    .venv/bin/python tests/bench/reconcile_bench.py [--nodes 20] [--keep]

Starts N simulated T4 nodes (bench-01 ...), converges them with the reconciler, then
measures, side by side on the same converged fleet:

  sweep      python -m runner reconcile --once   (steady state: the probe only)
  check      ansible-playbook site.yml --check   (Ansible's usual drift check)
  apply      ansible-playbook site.yml           (a converge pass that changes nothing)
  repair     one injected drift (dcgm-exporter stopped on one node), repaired by
             python -m runner reconcile --once
  one-host   ansible-playbook site.yml --limit <that node>  (one host's apply)

and the sweep over a quarter, half and all of the fleet (its cost should grow
linearly). Each figure is wall-clock seconds and control-host CPU seconds (user +
system of every process the step started; work inside the nodes' containers is not
counted, the same for every method). Ratios are against the check-mode playbook.

Then the sweep against its floor, at each of --sizes (default 10, 20 and 50, those
not above N), with the same connection and forks (the runner's default for that many
hosts), in rounds that alternate the commands:

  sweep      python -m runner reconcile --once --limit <the first n nodes>
  probe      ansible <those nodes> -m gpufleet.nvidia.node_state  (the probe alone:
             what the sweep adds on top is the runner's own work)
  floor      ansible <those nodes> -m ping   (one round trip per host doing nothing)

with medians of the rounds, the sweep/floor ratio, per-host cost and the peak memory
of the controller's processes during the sweep (the sum over its process tree,
sampled). Beside these, the steady sweep as the long-running loop does it
(`reconcile --interval`, what runs in production): a cycle's duration as the loop's
own metric gpufleet_reconcile_cycle_duration_seconds reports it, once the first
cycle (which pays the start-up: Python, the imports, hashing the project) is over;
as many rounds again of the probe and the floor alternate with its cycles, run
while it sleeps, and count in their medians. This is a script, not a test: nothing
here asserts a time.

Onboarding every node costs about a minute of this machine's time per node (50 nodes:
over an hour on 2 cores). With --copies only the first node is onboarded; the others
start from a copy of its converged disk (tests/sim/fleet.py up --copy-of) and the
state learns them from its record, as a reconciler that onboarded them would have
left it. A copy boots with an empty /run, as a node does after a reboot, so one sweep
first puts back what onboarding left there (the validation markers, the CDI spec);
then what the sweep meets on each node is what onboarding leaves there. The
onboarding figure is that of one node.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from runner.engine import default_forks
from runner.state import StateStore, state_dir_for

PROJECT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FLEET = [sys.executable, str(PROJECT / "tests" / "sim" / "fleet.py")]


@dataclass
class Cost:
    name: str
    hosts: int
    wall: float
    cpu: float

    def line(self, baseline: Cost | None) -> str:
        ratio = f"{baseline.wall / self.wall:6.1f}x" if baseline else "   -   "
        return (
            f"{self.name:<34} {self.hosts:>5} {self.wall:8.1f} {self.cpu:8.1f} "
            f"{self.wall / self.hosts:8.2f} {self.cpu / self.hosts:8.2f}  {ratio}"
        )


def _tree_rss(root: int) -> int:
    """Resident memory (bytes) of a process and all its descendants, from /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            statm = Path(entry.path, "statm").read_text().split()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
        rss[int(entry.name)] = int(statm[1]) * page
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        tree.update(children)
        frontier.extend(children)
    return sum(rss.get(pid, 0) for pid in tree)


@dataclass
class Run:
    wall: float
    cpu: float
    peak_rss: int


def run(name: str, command: list[str], expect: tuple[int, ...] = (0,)) -> Run:
    """Run `command` from the project; its wall time, CPU seconds (its whole process
    tree) and the peak of its tree's resident memory, sampled every 0.1 s."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.1):
            peak = max(peak, _tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    done.set()
    sampler.join()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in expect:
        sys.exit(
            f"{name}: {' '.join(command)} exited {proc.returncode}\n"
            f"{stdout[-3000:]}{stderr[-3000:]}"
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"  {name}: {wall:.1f} s", file=sys.stderr)
    return Run(wall, cpu, peak)


def measure(name: str, hosts: int, command: list[str], expect: tuple[int, ...] = (0,)) -> Cost:
    result = run(name, command, expect)
    return Cost(name, hosts, result.wall, result.cpu)


def floor_table(
    names: list[str], sizes: list[int], reconcile: list[str], inventory: Path, rounds: int
) -> list[str]:
    """The sweep against its floor at each size, in alternating rounds (medians);
    returns the table's lines."""
    ansible = [str(BIN / "ansible"), "-i", str(inventory)]
    rows = []
    for size in sizes:
        subset = ",".join(names[:size])
        forks = str(default_forks(size))
        commands = {
            "sweep": [*reconcile, "--limit", subset, "--forks", forks],
            "probe": [
                *ansible,
                subset,
                "--forks",
                forks,
                "-m",
                "gpufleet.nvidia.node_state",
                "-a",
                "sysfs_root={{ gpufleet_sysfs_root | default(omit) }}",
            ],
            "floor": [*ansible, subset, "--forks", forks, "-m", "ping"],
        }
        runs: dict[str, list[Run]] = {key: [] for key in commands}
        for attempt in range(rounds):
            for key, command in commands.items():
                runs[key].append(run(f"{key} over {size} nodes, round {attempt + 1}", command))
        # Then the loop (it holds the inventory's lock: no --once beside it), its
        # cycles alternating with more rounds of the probe and the floor, run while it
        # sleeps. A cycle of 5 nodes takes about 1.5 s and the probe and floor about 3
        # s: the interval leaves room for both at every size.
        cycles: list[float] = []
        loop = [arg for arg in reconcile if arg != "--once"]
        interval = max(10.0, 0.8 * size)
        with _loop([*loop, "--limit", subset, "--forks", forks], interval) as next_cycle:
            next_cycle()  # the first cycle pays the start-up: not the steady sweep
            for attempt in range(rounds):
                for key in ("probe", "floor"):
                    label = f"{key} over {size} nodes, loop round {attempt + 1}"
                    runs[key].append(run(label, commands[key]))
                cycles.append(next_cycle())
                print(f"  loop cycle over {size} nodes: {cycles[-1]:.2f} s", file=sys.stderr)
        rows.append((size, forks, {k: _median(v) for k, v in runs.items()}, cycles))
    lines = [
        f"\nsweep against its floor ({rounds} rounds each, medians; forks as the runner's)",
        f"{'nodes':>5} {'forks':>5} {'sweep s':>8} {'loop s':>8} {'probe s':>8} {'floor s':>8} "
        f"{'sweep/floor':>11} {'loop/floor':>10} {'sweep/h s':>9} {'cpu/h s':>8} {'peak MiB':>8}",
    ]
    for size, forks, m, cycles in rows:
        sweep, probe, floor = m["sweep"], m["probe"], m["floor"]
        cycle = statistics.median(cycles)
        lines.append(
            f"{size:>5} {forks:>5} {sweep.wall:8.2f} {cycle:8.2f} {probe.wall:8.2f} "
            f"{floor.wall:8.2f} {sweep.wall / floor.wall:10.2f}x {cycle / floor.wall:9.2f}x "
            f"{sweep.wall / size:9.3f} {sweep.cpu / size:8.3f} {sweep.peak_rss / 2**20:8.0f}"
        )
    return lines


@contextmanager
def _loop(command: list[str], interval: float) -> Iterator[Callable[[], float]]:
    """Run the reconcile loop; yields a function that waits for its next cycle to end
    and returns that cycle's duration, read from the loop's own metrics."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [*command, "--interval", str(interval), "--metrics-port", str(port)],
        cwd=PROJECT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen = (0.0, 0.0)

    def next_cycle() -> float:
        nonlocal seen
        deadline = time.monotonic() + interval * 2 + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                sys.exit(f"the reconcile loop exited {proc.returncode}: {' '.join(command)}")
            now = _cycle_metrics(port)
            if now is not None and now[0] > seen[0]:
                duration, seen = now[1] - seen[1], now
                return duration
            time.sleep(0.1)
        sys.exit(f"the reconcile loop finished no cycle in time: {' '.join(command)}")

    try:
        yield next_cycle
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def _cycle_metrics(port: int) -> tuple[float, float] | None:
    """(cycles, seconds) so far from the loop's metrics; None before it serves them."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    values = dict(
        re.findall(r"^gpufleet_reconcile_cycle_duration_seconds_(count|sum) (\S+)$", text, re.M)
    )
    if len(values) < 2:
        return None
    return float(values["count"]), float(values["sum"])


def _median(runs: list[Run]) -> Run:
    return Run(
        statistics.median(r.wall for r in runs),
        statistics.median(r.cpu for r in runs),
        max(r.peak_rss for r in runs),
    )


def up(names: list[str], hosts_file: Path, *options: str) -> None:
    nodes = [a for n in names for a in ("--node", f"{n}=t4-1")]
    command = [*FLEET, "up", *options, *nodes, "--write-inventory", str(hosts_file)]
    subprocess.run(command, check=True)


def copy_fleet(names: list[str], inventory: Path, state: Path) -> None:
    """Start names[1:] as copies of the converged names[0], add them to the inventory
    and give each the state record names[0] has (the nodes are the same)."""
    first, rest = names[0], names[1:]
    print(f"starting {len(rest)} copies of {first}", file=sys.stderr)
    copies = inventory.parent / "copies.yml"
    up(rest, copies, "--copy-of", first)
    hosts_file = inventory / "hosts.yml"
    document = yaml.safe_load(hosts_file.read_text())
    added = yaml.safe_load(copies.read_text())["all"]["children"]["gpu_nodes"]["hosts"]
    document["all"]["children"]["gpu_nodes"]["hosts"].update(added)
    hosts_file.write_text(yaml.safe_dump(document, sort_keys=True))
    with StateStore(state_dir_for(state, str(inventory))) as store:
        record = store.host(first)
        for name in rest:
            store.save(replace(record, name=name))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=20, help="simulated nodes (default 20)")
    parser.add_argument("--keep", action="store_true", help="leave the nodes running")
    parser.add_argument(
        "--sizes",
        default="10,20,50",
        help="fleet sizes of the sweep/floor table, those not above --nodes (default %(default)s)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size (default 3)")
    parser.add_argument(
        "--floor-only", action="store_true", help="only onboard and measure the sweep/floor table"
    )
    parser.add_argument(
        "--copies",
        action="store_true",
        help="onboard the first node only, start the others as copies of its converged disk",
    )
    args = parser.parse_args()
    if args.nodes < 4:
        parser.error("--nodes: expected at least 4 (the sweep is measured over N/4)")
    try:
        sizes = sorted({int(size) for size in args.sizes.split(",")})
    except ValueError:
        parser.error(f"--sizes: expected comma-separated numbers of nodes, got {args.sizes!r}")
    sizes = [size for size in sizes if 0 < size <= args.nodes] or [args.nodes]
    names = [f"bench-{i:02d}" for i in range(1, args.nodes + 1)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"))
    os.environ.update(env)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    inventory = work / "inventory"
    inventory.mkdir()
    hosts_file = inventory / "hosts.yml"
    (inventory / "group_vars").symlink_to(PROJECT / "inventories" / "sim" / "group_vars")
    where = ["-i", str(inventory), "--state-dir", str(work / "state")]
    reconcile = [sys.executable, "-m", "runner", "reconcile", "--once", "--quiet", *where]
    playbook = [str(BIN / "ansible-playbook"), "-i", str(inventory), "site.yml"]
    try:
        onboarded = names[:1] if args.copies else names
        print(f"starting {len(onboarded)} simulated T4 node(s)", file=sys.stderr)
        up(onboarded, hosts_file)
        print("converging them (first reconcile cycle)", file=sys.stderr)
        onboard = measure("onboarding (first cycle)", len(onboarded), reconcile)
        if args.copies:
            copy_fleet(names, inventory, work / "state")
            # The copies booted with an empty /run, as after a reboot: the first sweep
            # puts back what onboarding left there (validation markers, the CDI spec).
            print("settling the copies (one sweep)", file=sys.stderr)
            measure("sweep settling the copies", args.nodes, reconcile)
        if args.floor_only:
            print("\n".join(floor_table(names, sizes, reconcile, inventory, args.rounds)))
            return 0
        print("measuring", file=sys.stderr)
        sweep = measure("reconcile --once (steady sweep)", args.nodes, reconcile)
        check = measure("ansible-playbook site.yml --check", args.nodes, [*playbook, "--check"])
        apply = measure("ansible-playbook site.yml", args.nodes, playbook)
        # The converge pass above left the fleet as the reconciler recorded it.
        sweep2 = measure("reconcile --once (again)", args.nodes, reconcile)
        target = names[len(names) // 2]
        subprocess.run(
            ["podman", "exec", target, "systemctl", "stop", "nvidia-dcgm-exporter.service"],
            check=True,
        )
        repair = measure(f"repair one drift ({target})", args.nodes, reconcile)
        one = measure("one host's apply (--limit)", 1, [*playbook, "--limit", target])
        scaled = []
        for share in (4, 2):
            subset = names[: args.nodes // share]
            scaled.append(
                measure(
                    f"sweep over {len(subset)} nodes",
                    len(subset),
                    [*reconcile, "--limit", ",".join(subset)],
                )
            )
        floor = floor_table(names, sizes, reconcile, inventory, args.rounds)
    finally:
        if not args.keep:
            subprocess.run([*FLEET, "down", *names], check=False, capture_output=True)

    print(f"\ngpufleet reconcile benchmark: {args.nodes} simulated T4 nodes, {os.cpu_count()} CPUs")
    print(f"{'':<34} {'hosts':>5} {'wall s':>8} {'cpu s':>8} {'wall/h':>8} {'cpu/h':>8}  vs check")
    for cost in (onboard, check, apply, sweep, sweep2, *scaled, repair, one):
        print(cost.line(check if cost is not check else None))
    best = min(sweep.wall, sweep2.wall)
    print()
    print(f"steady-state sweep vs check-mode playbook: {check.wall / best:.1f}x faster (aim: 10x)")
    print(f"steady-state sweep vs converge pass:       {apply.wall / best:.1f}x faster")
    budget = best + one.wall
    print(
        f"one-drift repair: {repair.wall:.1f} s; sweep + one host's apply: {budget:.1f} s "
        f"(ratio {repair.wall / budget:.2f}, target <= 1)"
    )
    per_host = [c.wall / c.hosts for c in (*scaled, sweep)]
    print(
        "sweep wall time per host at N/4, N/2, N: "
        + ", ".join(f"{p:.2f} s" for p in per_host)
        + " (linear cost: per-host time flat or falling)"
    )
    print("\n".join(floor))
    return 0


if __name__ == "__main__":
    sys.exit(main())
