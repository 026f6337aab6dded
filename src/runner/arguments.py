# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The command line's arguments: `build_parser()` and the exit codes' help text."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import Any

from runner import __version__, site
from runner.alerting import DEFAULT_EXPORTER_JOB
from runner.engine import DEFAULT_HOSTS, STAGES
from runner.output import EXIT_TEXT, program
from runner.state import HistoryKind

JSON_HELP = "print one JSON document {schema_version, kind, data} (docs/cli.md)"


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


def _pattern(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected an Ansible host pattern, got nothing")
    return text.strip()


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
        prog=program(),
        description="Keep a fleet of NVIDIA GPU nodes converged.",
        epilog=EXIT_TEXT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpufleet runner {__version__}")
    common, acting = _common(), _acting()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    rec = sub.add_parser(
        "reconcile", parents=[common, acting], help="keep the fleet converged", epilog=EXIT_TEXT
    )
    _reconcile(rec)
    _failures(rec)
    _health(rec)
    _others(sub, common, acting)
    return parser


def _common() -> argparse.ArgumentParser:
    """Options of every command."""
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
    return common


def _acting() -> argparse.ArgumentParser:
    """Options of the commands that run Ansible (reconcile, plan)."""
    acting = argparse.ArgumentParser(add_help=False)
    acting.add_argument(
        "--hosts",
        type=_pattern,
        default=os.environ.get("GPUFLEET_HOSTS") or DEFAULT_HOSTS,
        metavar="PATTERN",
        help="the hosts gpufleet manages, an Ansible host pattern; no other host of the "
        "inventory is contacted (default $GPUFLEET_HOSTS, else the group %(default)s)",
    )
    acting.add_argument("-l", "--limit", help="Ansible host pattern: only these hosts (of --hosts)")
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
    site.add_options(acting)
    return acting


def _reconcile(rec: argparse.ArgumentParser) -> None:
    when = rec.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="one cycle, then exit")
    when.add_argument(
        "--interval",
        type=_positive(float, 1),
        default=300.0,
        help="seconds between cycles, jittered by 10%% (default %(default)s)",
    )
    rec.add_argument("--check", action="store_true", help="probe and plan only; apply nothing")
    rec.add_argument("--json", action="store_true", help=f"with --once: {JSON_HELP}")
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
    rec.add_argument("--metrics-address", default="127.0.0.1", help="Prometheus endpoint address")
    rec.add_argument(
        "--metrics-port",
        type=_positive(int, 0),
        default=None,
        help="serve Prometheus metrics on this port (default: 9842 in loop mode, none "
        "with --once; 0 turns it off)",
    )


def _failures(rec: argparse.ArgumentParser) -> None:
    """What happens to a host whose applies fail."""
    rec.add_argument(
        "--quarantine-after",
        type=_positive(int, 1),
        default=5,
        help="failures of a host in a row after which it is quarantined, left alone "
        "until `release` (default %(default)s)",
    )
    rec.add_argument(
        "--backoff-base",
        type=_positive(float, 1),
        default=60.0,
        help="seconds a host waits after its first failure; doubled after each "
        "further one (default %(default)s)",
    )
    rec.add_argument(
        "--backoff-cap",
        type=_positive(float, 1),
        default=3600.0,
        help="the longest wait after a failure, in seconds (default %(default)s)",
    )


def _health(rec: argparse.ArgumentParser) -> None:
    """GPU remediation (docs/health.md)."""
    rec.add_argument(
        "--health-breaker",
        type=_positive(int, 0),
        default=3,
        help="hosts asking a GPU reset or a reboot at once at which automatic "
        "remediation stops (0: never; default %(default)s)",
    )
    rec.add_argument(
        "--health-window",
        type=_positive(float, 0),
        default=86400.0,
        help="seconds after a remediation in which a GPU asking again is quarantined "
        "(default %(default)s)",
    )


def _others(sub: Any, common: argparse.ArgumentParser, acting: argparse.ArgumentParser) -> None:
    """plan, status, history, release, version, monitoring."""
    plan = sub.add_parser(
        "plan", parents=[common, acting], help="what would change, with diffs", epilog=EXIT_TEXT
    )
    plan.add_argument(
        "--all", action="store_true", help="plan every host, not only those the probe flags"
    )
    plan.add_argument("--json", action="store_true", help=JSON_HELP)

    status = sub.add_parser("status", parents=[common], help="hosts x stages", epilog=EXIT_TEXT)
    status.add_argument("--json", action="store_true", help=JSON_HELP)

    hist = sub.add_parser("history", parents=[common], help="what happened")
    hist.add_argument("--host", help="only this host")
    hist.add_argument("-n", type=_positive(int, 1), default=50, help="entries (default 50)")
    hist.add_argument(
        "--kind",
        action="append",
        default=[],
        choices=[str(kind) for kind in HistoryKind],
        help="only entries of this kind; repeat for several (%(choices)s)",
    )
    hist.add_argument("--json", action="store_true", help=JSON_HELP)
    _release_and_version(sub, common)


def _release_and_version(sub: Any, common: argparse.ArgumentParser) -> None:
    rel = sub.add_parser(
        "release", parents=[common], help="clear a host's quarantine or halted rollout"
    )
    rel.add_argument("hosts", nargs="+", metavar="HOST", help="the hosts to release")
    rel.add_argument("--json", action="store_true", help=JSON_HELP)

    version = sub.add_parser(
        "version", help="the version, and where the playbooks it runs come from"
    )
    version.add_argument("--json", action="store_true", help=JSON_HELP)
    _monitoring(sub)


def _monitoring(sub: Any) -> None:
    mon = sub.add_parser(
        "monitoring",
        help="print the Prometheus rules or the Grafana dashboard, made for this site",
        epilog="docs/monitoring.md: the alerts, their runbooks and the dashboard.",
    )
    mon.add_argument(
        "what",
        choices=["rules", "dashboard"],
        help="the alerting and recording rules, or the dashboard",
    )
    mon.add_argument(
        "--runbook-url",
        metavar="URL",
        help="where the site serves docs/monitoring.md: each alert gets runbook_url URL#<alert>",
    )
    mon.add_argument(
        "--exporter-job",
        metavar="REGEX",
        default=DEFAULT_EXPORTER_JOB,
        help="the exporters' scrape job names, a regular expression (default %(default)s)",
    )
    mon.add_argument(
        "--kubernetes",
        action="store_true",
        help="as a PrometheusRule (rules), or a ConfigMap for Grafana's dashboard sidecar",
    )
    mon.add_argument("--name", default="gpufleet", help="with --kubernetes: the object's name")
    mon.add_argument("--namespace", help="with --kubernetes: the object's namespace")
    mon.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --kubernetes: a label, such as the one Prometheus's ruleSelector asks for",
    )
    mon.add_argument("--json", action="store_true", help=JSON_HELP)
