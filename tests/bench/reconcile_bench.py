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
This is a script, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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


def measure(name: str, hosts: int, command: list[str], expect: tuple[int, ...] = (0,)) -> Cost:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    result = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode not in expect:
        sys.exit(
            f"{name}: {' '.join(command)} exited {result.returncode}\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"  {name}: {wall:.1f} s", file=sys.stderr)
    return Cost(name, hosts, wall, cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=20, help="simulated nodes (default 20)")
    parser.add_argument("--keep", action="store_true", help="leave the nodes running")
    args = parser.parse_args()
    if args.nodes < 4:
        parser.error("--nodes: expected at least 4 (the sweep is measured over N/4)")
    names = [f"bench-{i:02d}" for i in range(1, args.nodes + 1)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"))
    os.environ.update(env)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    inventory = work / "inventory"
    inventory.mkdir()
    hosts_file = inventory / "hosts.yml"
    nodes = [a for n in names for a in ("--node", f"{n}=t4-1")]
    print(f"starting {args.nodes} simulated T4 nodes", file=sys.stderr)
    subprocess.run([*FLEET, "up", *nodes, "--write-inventory", str(hosts_file)], check=True)
    (inventory / "group_vars").symlink_to(PROJECT / "inventories" / "sim" / "group_vars")
    where = ["-i", str(inventory), "--state-dir", str(work / "state")]
    reconcile = [sys.executable, "-m", "runner", "reconcile", "--once", "--quiet", *where]
    playbook = [str(BIN / "ansible-playbook"), "-i", str(inventory), "site.yml"]
    try:
        print("converging the fleet (first reconcile cycle)", file=sys.stderr)
        onboard = measure("onboarding (first cycle)", args.nodes, reconcile)
        print("measuring", file=sys.stderr)
        sweep = measure("reconcile --once (steady sweep)", args.nodes, reconcile)
        check = measure("ansible-playbook site.yml --check", args.nodes, [*playbook, "--check"])
        apply = measure("ansible-playbook site.yml", args.nodes, playbook)
        # The converge pass above left the fleet as the reconciler recorded it.
        sweep2 = measure("reconcile --once (again)", args.nodes, reconcile)
        target = names[len(names) // 2]
        subprocess.run(
            ["podman", "exec", target, "systemctl", "stop", "dcgm-exporter.service"], check=True
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
