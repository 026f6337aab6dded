"""Command line of the gpufleet reconciler: `python -m runner COMMAND`.

    reconcile   keep the fleet converged (a loop; --once for one cycle)
    plan        what a cycle would change, per host and component, with diffs
    status      hosts x stages as the last cycles left them (reads state only)
    history     what happened: drift, repairs, intentional changes, failures
    release     clear a host's quarantine, backoff or halted rollout

Exit codes are listed in EXIT below and in `--help`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from enum import IntEnum
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from runner import __version__
from runner.engine import STAGES, AnsibleEngine, EngineError
from runner.lock import InventoryLock, LockHeld
from runner.reconcile import (
    CycleReport,
    LogObserver,
    Observer,
    Reconciler,
    Settings,
    Stop,
    release,
)
from runner.rollout import IN_FLIGHT, PolicyError
from runner.state import (
    ClusterRecord,
    HostRecord,
    HostStatus,
    RolloutRecord,
    StateError,
    StateStore,
    ensure_private_dir,
    state_dir_for,
)


class Exit(IntEnum):
    OK = 0
    FAILED = 1  # a host failed, is unreachable, quarantined, waits for a reboot or halted a rollout
    USAGE = 2  # bad arguments or inventory; nothing was touched
    LOCKED = 3  # another reconciler works on this inventory
    STATE = 4  # the state database cannot be used
    PENDING = 5  # plan / reconcile --check: changes are pending
    INTERRUPTED = 130  # stopped by SIGINT or SIGTERM after the current batch


EXIT_TEXT = """exit codes: 0 done (fleet converged, or nothing to do); 1 a host failed, is
unreachable, quarantined or waiting for a reboot, or a rollout halted; 2 bad
arguments or inventory
(nothing touched); 3 another reconciler holds the inventory's lock; 4 the state
database is unusable; 5 (plan, reconcile --check) changes are pending; 130
stopped by a signal after the current batch."""

# The checkout this package lives in, when installed editable (`make venv`).
CHECKOUT = Path(__file__).resolve().parents[2]
log = logging.getLogger("runner")


class UsageError(Exception):
    """Bad input; the message names it and the expected form."""


def _default_state_dir() -> Path:
    if os.environ.get("GPUFLEET_STATE_DIR"):
        return Path(os.environ["GPUFLEET_STATE_DIR"])
    if os.geteuid() == 0:
        return Path("/var/lib/gpufleet-runner")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpufleet"


def _positive(kind: type, minimum: float) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected at least {minimum}, got {text}")
        return value

    return parse


def _components(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in STAGES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown component {', '.join(unknown) or repr(text)}; expected a comma-separated "
            f"list of {', '.join(STAGES)}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m runner",
        description="Keep a fleet of NVIDIA GPU nodes converged.",
        epilog=EXIT_TEXT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpufleet runner {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-i",
        "--inventory",
        default=os.environ.get("GPUFLEET_INVENTORY"),
        help="Ansible inventory (file or directory; default $GPUFLEET_INVENTORY)",
    )
    common.add_argument(
        "--state-dir",
        type=Path,
        default=_default_state_dir(),
        help="where state lives, one database per inventory (default %(default)s)",
    )
    common.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="log lines on stderr"
    )
    common.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    common.add_argument(
        "--local",
        action="store_true",
        help="pull mode: this node only (reconciled over a local connection)",
    )
    common.add_argument(
        "--node-name",
        default=socket.gethostname(),
        help="with --local: this node's inventory name (default %(default)s)",
    )
    acting = argparse.ArgumentParser(add_help=False)
    acting.add_argument("-l", "--limit", help="Ansible host pattern: only these hosts")
    acting.add_argument(
        "--components",
        type=_components,
        default=(),
        help=f"act only on drift in / changes to these ({', '.join(STAGES)}); an apply "
        "still runs every stage on the host, since stages build on each other",
    )
    acting.add_argument(
        "--rebuild-state",
        action="store_true",
        help="move an unreadable state database aside and start a new one",
    )
    acting.add_argument(
        "--keep-runs",
        type=_positive(int, 1),
        default=10,
        help="Ansible run artifacts kept (default %(default)s)",
    )
    acting.add_argument(
        "--forks",
        type=_positive(int, 1),
        default=None,
        help="parallel Ansible connections (default: the inventory's "
        "gpufleet_reconcile_forks, else one per host up to 10 per CPU)",
    )
    acting.add_argument(
        "--full-check-interval",
        type=_positive(float, 60),
        default=86400.0,
        help="plan every host once per this many seconds, each at its own offset in "
        "it (default %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    rec = sub.add_parser(
        "reconcile", parents=[common, acting], help="keep the fleet converged", epilog=EXIT_TEXT
    )
    when = rec.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="one cycle, then exit")
    when.add_argument(
        "--interval",
        type=_positive(float, 1),
        default=300.0,
        help="seconds between cycles, jittered by 10%% (default %(default)s)",
    )
    rec.add_argument("--check", action="store_true", help="probe and plan only; apply nothing")
    rec.add_argument(
        "--json", action="store_true", help="with --once: print the cycle's report as JSON"
    )
    rec.add_argument(
        "--max-parallel",
        type=_positive(int, 1),
        default=1,
        help="hosts per rollout batch, for pools whose inventory sets no "
        "gpufleet_rollout_max_parallel (default %(default)s)",
    )
    rec.add_argument(
        "--max-unavailable",
        type=_positive(int, 1),
        default=1,
        help="hosts of a pool out of service at once, where the inventory sets no "
        "gpufleet_rollout_max_unavailable (default %(default)s)",
    )
    rec.add_argument("--quarantine-after", type=_positive(int, 1), default=5)
    rec.add_argument("--backoff-base", type=_positive(float, 1), default=60.0)
    rec.add_argument("--backoff-cap", type=_positive(float, 1), default=3600.0)
    rec.add_argument("--metrics-address", default="127.0.0.1", help="Prometheus endpoint address")
    rec.add_argument(
        "--metrics-port",
        type=_positive(int, 0),
        default=None,
        help="serve Prometheus metrics on this port (default: 9842 in loop mode, none "
        "with --once; 0 turns it off)",
    )

    plan = sub.add_parser(
        "plan", parents=[common, acting], help="what would change, with diffs", epilog=EXIT_TEXT
    )
    plan.add_argument(
        "--all", action="store_true", help="plan every host, not only those the probe flags"
    )
    plan.add_argument("--json", action="store_true", help="machine-readable output")

    status = sub.add_parser("status", parents=[common], help="hosts x stages")
    status.add_argument("--json", action="store_true", help="machine-readable output")

    hist = sub.add_parser("history", parents=[common], help="what happened")
    hist.add_argument("--host", help="only this host")
    hist.add_argument("-n", type=_positive(int, 1), default=50, help="entries (default 50)")
    hist.add_argument("--kind", action="append", default=[], help="only entries of this kind")
    hist.add_argument("--json", action="store_true", help="machine-readable output")

    rel = sub.add_parser(
        "release", parents=[common], help="clear a host's quarantine or halted rollout"
    )
    rel.add_argument("hosts", nargs="+", metavar="HOST")
    return parser


# -- logging -------------------------------------------------------------------


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "time": round(record.created, 3),
                "level": record.levelname.lower(),
                "message": record.getMessage(),
            }
        )


def _setup_logging(fmt: str, quiet: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S")
    )
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False


# -- commands ------------------------------------------------------------------


def find_project() -> Path:
    """The gpufleet checkout whose playbooks the reconciler runs: $GPUFLEET_PROJECT if
    set, else the checkout of an editable install, else the working directory (a
    node's /opt/gpufleet in pull mode, where the package is installed from it)."""
    named = os.environ.get("GPUFLEET_PROJECT")
    places = [Path(named)] if named else [CHECKOUT, Path.cwd()]
    for place in places:
        if (place / "site.yml").is_file() and (place / "playbooks").is_dir():
            return place.resolve()
    where = f"$GPUFLEET_PROJECT={named}" if named else f"{CHECKOUT} or {Path.cwd()}"
    raise UsageError(
        f"no gpufleet checkout (site.yml and playbooks/) at {where}: run from the "
        "checkout or set GPUFLEET_PROJECT to it"
    )


def _inventory(args: argparse.Namespace, state_dir: Path) -> str:
    if args.inventory is None:
        return _local_inventory(state_dir, args.node_name)
    return str(args.inventory)


def _local_inventory(base: Path, node: str) -> str:
    ensure_private_dir(base)
    path = base / "local-inventory.yml"
    data = {"all": {"hosts": {node: {"ansible_connection": "local"}}}}
    text = yaml.safe_dump(data)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return str(path)


def _state_dir(args: argparse.Namespace) -> Path:
    base: Path = args.state_dir
    if args.inventory:
        return state_dir_for(base, args.inventory)
    if getattr(args, "local", False):
        return state_dir_for(base, f"local-{args.node_name}")
    raise UsageError(
        "no inventory: name one with -i INVENTORY or $GPUFLEET_INVENTORY (the simulated "
        "fleet's is inventories/sim)"
    )


def _open_store(directory: Path, rebuild: bool = False) -> StateStore:
    store = StateStore(directory)
    try:
        return store.open()
    except StateError:
        if not rebuild:
            raise
        log.warning("state database unreadable; moved aside, starting a new one")
        return store.rebuild()


def _settings(args: argparse.Namespace, check_only: bool) -> Settings:
    settings = Settings(
        check_only=check_only,
        limit=args.limit,
        components=args.components,
        full_check_interval=args.full_check_interval,
    )
    if args.local:
        settings = replace(settings, limit=args.node_name)
    if args.command == "reconcile":
        settings = replace(
            settings,
            interval=args.interval,
            max_parallel=args.max_parallel,
            max_unavailable=args.max_unavailable,
            quarantine_after=args.quarantine_after,
            backoff_base=args.backoff_base,
            backoff_cap=args.backoff_cap,
        )
        if args.json and not args.once:
            raise UsageError("--json prints one cycle's report: use it with --once")
        if args.max_parallel > args.max_unavailable:
            raise UsageError(
                f"--max-parallel {args.max_parallel} exceeds --max-unavailable "
                f"{args.max_unavailable}: a batch could never start"
            )
    if args.command == "plan" and args.all:
        settings = replace(settings, full_check_interval=0.0)
    return settings


def _run_cycle(args: argparse.Namespace) -> int:
    project = find_project()
    directory = _state_dir(args)
    inventory = _inventory(args, directory)
    settings = _settings(args, check_only=args.command == "plan" or args.check)
    ensure_private_dir(directory)
    stop = Stop()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.request()
        name = signal.Signals(signum).name
        if stop.urgent:
            log.warning("%s again: cancelling the running Ansible run", name)
        else:
            log.warning("%s: finishing the current batch, then stopping", name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with InventoryLock(directory), _open_store(directory, args.rebuild_state) as store:
            engine = AnsibleEngine(
                project,
                inventory,
                directory / "ansible",
                keep_runs=args.keep_runs,
                forks=args.forks,
                extravars={"ansible_connection": "local"} if args.local else None,
                progress=None if args.quiet else _progress,
                cancel=lambda: stop.urgent,
            )
            observers: list[Observer] = [LogObserver()]
            once = args.command == "plan" or args.once
            if args.command == "reconcile":
                port = args.metrics_port if args.metrics_port is not None else (0 if once else 9842)
                if port:
                    from runner.metrics import Metrics

                    metrics = Metrics()
                    metrics.serve(args.metrics_address, port)
                    log.info("metrics on http://%s:%d/metrics", args.metrics_address, port)
                    observers.append(metrics)
            reconciler = Reconciler(
                engine, store, settings, stop=stop, observers=observers, background=not once
            )
            report = reconciler.run(once=once)
            if args.command == "plan" and args.json:
                print(json.dumps({h: asdict(o) for h, o in sorted(report.outcomes.items())}))
            elif args.command == "reconcile" and args.json:
                print(json.dumps(asdict(report), indent=2, sort_keys=True))
            else:
                _print_report(report, store.hosts(), diffs=args.command == "plan")
            return _exit_for(report, store.hosts(), settings)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _progress(host: str, text: str) -> None:
    log.info("  %s: %s", host, text)


_UNWELL = (
    HostStatus.FAILED,
    HostStatus.REFUSED,
    HostStatus.UNREACHABLE,
    HostStatus.REBOOT_REQUIRED,
)


def _unwell(record: HostRecord) -> bool:
    """Whether the host is not where it should be, for the exit code."""
    return (
        record.quarantined
        or record.status in _UNWELL
        or record.rollout_phase == "halted"
        or record.rollout_reason.startswith("drain blocked")
    )


def _exit_for(report: CycleReport, hosts: dict[str, HostRecord], settings: Settings) -> int:
    if report.interrupted:
        return Exit.INTERRUPTED
    # Hosts this cycle acted on or skipped (backing off, quarantined) count alike:
    # the exit code says whether the fleet is where it should be.
    if any(_unwell(r) for name, r in hosts.items() if name in report.outcomes):
        return Exit.FAILED
    if report.cluster_failed:
        return Exit.FAILED
    pending = [o for o in report.outcomes.values() if o.pending or "drift" in o.reasons]
    if settings.check_only and (pending or report.cluster_pending):
        return Exit.PENDING
    return Exit.OK


def _print_report(report: CycleReport, hosts: dict[str, HostRecord], diffs: bool) -> None:
    took = report.finished - report.started
    print(
        f"cycle: {report.probed} probed, {report.planned} planned, {report.applied} applied "
        f"in {took:.1f} s" + (" (interrupted)" if report.interrupted else "")
    )
    for host, outcome in sorted(report.outcomes.items()):
        record = hosts.get(host)
        parts = [outcome.action]
        if outcome.reasons:
            parts.append("because " + ", ".join(outcome.reasons))
        if outcome.corrective:
            parts.append("repaired " + ", ".join(outcome.corrective))
        if outcome.intentional:
            parts.append("changed as desired " + ", ".join(outcome.intentional))
        if outcome.pending and outcome.action == "planned":
            parts.append("would change " + ", ".join(outcome.pending))
            if outcome.disruptive:
                parts.append("disruptive: rolled out in batches")
        if outcome.message:
            parts.append(outcome.message)
        if record is not None:
            parts.append(f"now {record.status}")
        print(f"  {host}: " + "; ".join(parts))
        if diffs:
            for component, texts in sorted(outcome.diffs.items()):
                for text in texts:
                    print(f"    [{component}] " + text.replace("\n", "\n      "))
    if report.cluster:
        print(f"  cluster side: {report.cluster}")
    for pool, text in sorted(report.rollouts.items()):
        print(f"  rollout of pool {pool}: {text}")


def _age(now: float, then: float | None) -> str:
    if then is None:
        return "never"
    seconds = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _host_line(record: HostRecord) -> str:
    where = record.failed_stage or ""
    why = record.reason if record.reason.startswith(f"{where}:") else f"{where}: {record.reason}"
    if record.quarantined:
        return f"quarantined ({why}); once fixed: runner release {record.name}"
    if record.status in _UNWELL:
        return f"{record.status} ({why})"
    if record.status == HostStatus.DRIFTED and record.drift:
        return "drifted (" + ", ".join(sorted({d["component"] for d in record.drift})) + ")"
    if record.rollout_phase:
        reason = f": {record.rollout_reason}" if record.rollout_reason else ""
        return f"{record.status}; rollout {record.rollout_phase}{reason}"
    if any(s == "pre-installed" for s in record.stages.values()):
        pre = [k for k, v in record.stages.items() if v == "pre-installed"]
        return f"{record.status} (pre-installed: {', '.join(pre)})"
    return record.status


def _stage_text(record: HostRecord, stage: str) -> str:
    """`stage=status`; the MIG stage names the layout it keeps (mig=ready:all-balanced),
    the Slurm stage the node's state in Slurm (slurm_gres=ready:IDLE)."""
    text = f"{stage}={record.stages[stage]}"
    if stage == "mig" and record.mig_layout:
        return f"{text}:{record.mig_layout}"
    if stage == "slurm_gres" and record.slurm_state:
        return f"{text}:{record.slurm_state}"
    return text


def cmd_status(args: argparse.Namespace) -> int:
    directory = _state_dir(args)
    if not (directory / "state.db").exists():
        raise UsageError(
            f"no state for inventory {args.inventory!r} yet: run `python -m runner reconcile "
            f"-i {args.inventory}` first"
        )
    with _open_store(directory) as store:
        hosts = store.hosts()
        cluster = store.cluster()
        rollouts = store.rollouts()
    if args.json:
        print(json.dumps([asdict(r) for r in hosts.values()], indent=2))
        return Exit.OK
    now = time.time()
    width = max([len(h) for h in hosts] + [4])
    print(f"{'HOST':<{width}}  {'STATE':<44} {'RECONCILED':<11} CHANGED     STAGES")
    for name, record in hosts.items():
        stages = " ".join(_stage_text(record, s) for s in STAGES if s in record.stages)
        print(
            f"{name:<{width}}  {_host_line(record):<44} {_age(now, record.last_reconcile):<11} "
            f"{_age(now, record.last_change):<11} {stages}"
        )
    if cluster.status != "unknown":
        print(f"cluster side: {_cluster_line(cluster)}, applied {_age(now, cluster.last_apply)}")
    for pool, rollout in rollouts.items():
        print(_rollout_line(pool, rollout, hosts, now))
    unwell = any(_unwell(r) for r in hosts.values()) or cluster.status == "failed"
    return Exit.FAILED if unwell else Exit.OK


def _rollout_line(
    pool: str, rollout: RolloutRecord, hosts: dict[str, HostRecord], now: float
) -> str:
    """A pool's rollout: done, in flight (with phases), queued, halted (with why)."""
    members = {h: r for h, r in hosts.items() if r.rollout_pool == pool and r.rollout_phase}
    flight = [f"{h} {r.rollout_phase}" for h, r in members.items() if r.rollout_phase in IN_FLIGHT]
    queued = [h for h, r in members.items() if r.rollout_phase == "queued"]
    halted = [
        f"{h} ({r.rollout_reason})" for h, r in members.items() if r.rollout_phase == "halted"
    ]
    if rollout.finished is not None:
        when = f"finished {_age(now, rollout.finished)}"
    else:
        when = f"started {_age(now, rollout.started)}"
    parts = [f"{len(rollout.done)} done"]
    for label, items in (("in flight", flight), ("queued", queued), ("halted", halted)):
        if items:
            parts.append(f"{label} {len(items)}: {', '.join(items)}")
    return f"rollout of pool {pool} ({when}): " + "; ".join(parts)


def _cluster_line(cluster: ClusterRecord) -> str:
    if cluster.status == "failed":
        owed = f"; owes the labels of {', '.join(cluster.owed_hosts)}" if cluster.owed_hosts else ""
        return f"failed ({cluster.reason}){owed}"
    if cluster.status == "drifted":
        return "drifted (" + ", ".join(f"{d['kind']} {d['name']}" for d in cluster.drift) + ")"
    return cluster.status


def cmd_history(args: argparse.Namespace) -> int:
    directory = _state_dir(args)
    with _open_store(directory) as store:
        entries = store.history(args.host, args.n, args.kind)
    if args.json:
        print(json.dumps([asdict(e) for e in entries], indent=2))
        return Exit.OK
    for e in entries:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at))
        component = f" [{e.component}]" if e.component else ""
        print(f"{stamp} {e.host} {e.kind}{component}: {e.summary}")
    return Exit.OK


def cmd_release(args: argparse.Namespace) -> int:
    directory = _state_dir(args)
    with _open_store(directory) as store:
        known = store.hosts()
        unknown = [h for h in args.hosts if h not in known]
        if unknown:
            raise UsageError(f"unknown host(s) {', '.join(unknown)}; known: {', '.join(known)}")
        for host in args.hosts:
            record = release(store, host)
            print(f"{host}: released; status {record.status}")
    return Exit.OK


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_format, args.quiet)
    try:
        if args.inventory is not None:
            if not Path(args.inventory).exists():
                raise UsageError(f"inventory {args.inventory!r} does not exist")
            args.inventory = str(Path(args.inventory).resolve())
        if args.command in ("reconcile", "plan"):
            return _run_cycle(args)
        if args.command == "status":
            return cmd_status(args)
        if args.command == "history":
            return cmd_history(args)
        return cmd_release(args)
    except (UsageError, EngineError, PolicyError, LockHeld, StateError) as err:
        print(f"error: {err}", file=sys.stderr)
        return _EXIT_FOR_ERROR[type(err)]


# Bad input, including an inventory Ansible cannot read, is a usage error.
_EXIT_FOR_ERROR: dict[type[Exception], int] = {
    UsageError: Exit.USAGE,
    EngineError: Exit.USAGE,
    PolicyError: Exit.USAGE,
    LockHeld: Exit.LOCKED,
    StateError: Exit.STATE,
}
