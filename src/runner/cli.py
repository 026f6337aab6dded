# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Command line of the gpufleet reconciler: `python -m runner COMMAND`.

    reconcile   keep the fleet converged (a loop; --once for one cycle)
    plan        what a cycle would change, per host and component, with diffs
    status      hosts x stages as the last cycles left them (reads state only)
    history     what happened: drift, repairs, intentional changes, failures
    release     clear a host's quarantine, backoff or halted rollout

Exit codes, JSON documents and the program's name are the contract of runner.output
(docs/cli.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from runner import __version__, alerting, show
from runner.arguments import build_parser
from runner.engine import DEFAULT_HOSTS, AnsibleEngine, EngineError, InventoryError
from runner.lock import InventoryLock, LockHeld
from runner.output import Exit, Kind, document, program
from runner.progress import LiveProgress, LogProgress, Progress
from runner.reconcile import (
    CycleReport,
    LogObserver,
    Observer,
    Reconciler,
    Settings,
    Stop,
    release,
)
from runner.rollout import PolicyError
from runner.site import passed_through
from runner.state import (
    ClusterStatus,
    HostRecord,
    StateError,
    StateStore,
    ensure_private_dir,
    state_dir_for,
)

# The checkout this package lives in, when installed editable (`make venv`).
CHECKOUT = Path(__file__).resolve().parents[2]
# The playbooks, roles and collection an installed wheel carries (pyproject.toml).
PACKAGED = Path(__file__).resolve().parent / "project"
log = logging.getLogger("runner")


class UsageError(Exception):
    """Bad input; the message names it and the expected form."""


# -- logging -------------------------------------------------------------------


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "message": record.getMessage(),
        }
        progress = getattr(record, "progress", None)  # runner.progress's fields
        if progress is not None:
            line["progress"] = progress
        return json.dumps(line)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a line is logged: while a live
    progress table stands, rich's stand-in, which puts the line above the table."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _setup_logging(fmt: str, quiet: bool) -> None:
    handler = _StderrHandler()
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
    """Where the playbooks the reconciler runs are (see project_source)."""
    return project_source()[0]


def project_source() -> tuple[Path, str]:
    """The playbooks, roles and collection the reconciler runs, and what they are:
    $GPUFLEET_PROJECT if set, else the checkout of an editable install, else the
    installed package's own copy, else the working directory (a checkout)."""
    named = os.environ.get("GPUFLEET_PROJECT")
    places = (
        [(Path(named), "$GPUFLEET_PROJECT")]
        if named
        else [(CHECKOUT, "checkout"), (PACKAGED, "installed package"), (Path.cwd(), "checkout")]
    )
    for place, what in places:
        if (place / "site.yml").is_file() and (place / "playbooks").is_dir():
            return place.resolve(), what
    where = f"$GPUFLEET_PROJECT={named}" if named else f"{CHECKOUT}, {PACKAGED} or {Path.cwd()}"
    raise UsageError(
        f"no gpufleet playbooks (site.yml and playbooks/) at {where}: install the "
        "package, run from a checkout or set GPUFLEET_PROJECT to one"
    )


def cmd_version(args: argparse.Namespace) -> int:
    project, what = project_source()
    if args.json:
        data = {"version": __version__, "playbooks": str(project), "source": what}
        print(document(Kind.VERSION, data))
        return Exit.OK
    print(f"gpufleet {__version__}")
    print(f"playbooks: {project} ({what})")
    return Exit.OK


def cmd_monitoring(args: argparse.Namespace) -> int:
    try:
        rendered, text = alerting.render(args)
    except alerting.MonitoringError as err:
        raise UsageError(str(err)) from err
    if args.json:
        print(document(Kind.MONITORING, rendered))
    else:
        print(text, end="")
    return Exit.OK


def _inventory(args: argparse.Namespace, state_dir: Path) -> str:
    if args.inventory is None:
        return _local_inventory(state_dir, args.node_name)
    return str(args.inventory)


def _local_inventory(base: Path, node: str) -> str:
    ensure_private_dir(base)
    path = base / "local-inventory.yml"
    data = {
        "all": {"children": {DEFAULT_HOSTS: {"hosts": {node: {"ansible_connection": "local"}}}}}
    }
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
            health_breaker=args.health_breaker,
            health_window=args.health_window,
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
            engine = _engine(args, project, inventory, directory, stop)
            once = args.command == "plan" or args.once
            reconciler = Reconciler(
                engine,
                store,
                settings,
                stop=stop,
                observers=_observers(args, once),
                background=not once,
            )
            report = reconciler.run(once=once)
            if args.json:
                print(document(Kind(args.command), asdict(report)))
            else:
                show.print_report(report, store.hosts(), diffs=args.command == "plan")
            return _exit_for(report, store.hosts(), settings)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _engine(
    args: argparse.Namespace, project: Path, inventory: str, directory: Path, stop: Stop
) -> AnsibleEngine:
    options, vault = passed_through(args)
    return AnsibleEngine(
        project,
        inventory,
        directory / "ansible",
        keep_runs=args.keep_runs,
        forks=args.forks,
        extravars={"ansible_connection": "local"} if args.local else None,
        hosts=args.hosts,
        options=options,
        vault_options=vault,
        progress=_progress(args),
        cancel=lambda: stop.urgent,
    )


def _observers(args: argparse.Namespace, once: bool) -> list[Observer]:
    """Log lines always; Prometheus metrics for reconcile where a port is given (by
    default in loop mode)."""
    observers: list[Observer] = [LogObserver()]
    if args.command == "reconcile":
        port = args.metrics_port if args.metrics_port is not None else (0 if once else 9842)
        if port:
            from runner.metrics import Metrics

            metrics = Metrics()
            metrics.serve(args.metrics_address, port)
            log.info("metrics on http://%s:%d/metrics", args.metrics_address, port)
            observers.append(metrics)
    return observers


def _progress(args: argparse.Namespace) -> Progress:
    """How runs show their progress: not at all with -q; a live table where stderr
    is a terminal and log lines are text; log lines otherwise."""
    if args.quiet:
        return Progress()
    if args.log_format == "text":
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal and not console.is_dumb_terminal:
            return LiveProgress(console)
    return LogProgress()


def _exit_for(report: CycleReport, hosts: dict[str, HostRecord], settings: Settings) -> int:
    if report.interrupted:
        return Exit.INTERRUPTED
    # Hosts this cycle acted on or skipped (backing off, quarantined) count alike:
    # the exit code says whether the fleet is where it should be.
    if any(show.unwell(r) for name, r in hosts.items() if name in report.outcomes):
        return Exit.FAILED
    if report.cluster_failed:
        return Exit.FAILED
    pending = [o for o in report.outcomes.values() if o.pending or "drift" in o.reasons]
    if settings.check_only and (pending or report.cluster_pending):
        return Exit.PENDING
    return Exit.OK


def cmd_status(args: argparse.Namespace) -> int:
    directory = _state_dir(args)
    if not (directory / "state.db").exists():
        raise UsageError(
            f"no state for inventory {args.inventory!r} yet: run `{program()} reconcile "
            f"-i {args.inventory}` first"
        )
    with _open_store(directory) as store:
        hosts = store.hosts()
        cluster = store.cluster()
        rollouts = store.rollouts()
    unwell = any(show.unwell(r) for r in hosts.values()) or cluster.status == ClusterStatus.FAILED
    if args.json:
        data = {
            "hosts": [asdict(r) for r in hosts.values()],
            "cluster": asdict(cluster),
            "rollouts": [asdict(r) for r in rollouts.values()],
        }
        print(document(Kind.STATUS, data))
    else:
        show.print_status(hosts, cluster, rollouts, time.time())
    return Exit.FAILED if unwell else Exit.OK


def cmd_history(args: argparse.Namespace) -> int:
    directory = _state_dir(args)
    with _open_store(directory) as store:
        entries = store.history(args.host, args.n, args.kind)
    if args.json:
        print(document(Kind.HISTORY, {"entries": [asdict(e) for e in entries]}))
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
        released = [release(store, host) for host in args.hosts]
    if args.json:
        data = {"released": [{"host": r.name, "status": r.status} for r in released]}
        print(document(Kind.RELEASE, data))
    else:
        for record in released:
            print(f"{record.name}: released; status {record.status}")
    return Exit.OK


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "version":
            return cmd_version(args)
        if args.command == "monitoring":
            return cmd_monitoring(args)
        _setup_logging(args.log_format, args.quiet)
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
        code = _EXIT_FOR_ERROR[type(err)]
        print(f"error: {err}", file=sys.stderr)
        if getattr(args, "json", False):
            print(document(Kind.ERROR, {"message": str(err), "exit_code": int(code)}))
        return code


# Bad input, including an inventory Ansible cannot read, is a usage error; Ansible
# failing to run in the middle of a cycle is not.
_EXIT_FOR_ERROR: dict[type[Exception], int] = {
    UsageError: Exit.USAGE,
    InventoryError: Exit.USAGE,
    EngineError: Exit.ENGINE,
    PolicyError: Exit.USAGE,
    LockHeld: Exit.LOCKED,
    StateError: Exit.STATE,
}
