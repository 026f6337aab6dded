"""The pull-mode units are accepted by systemd and start a command the runner accepts."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from runner import cli

PROJECT = Path(__file__).resolve().parents[2]
UNITS = PROJECT / "src" / "runner" / "systemd"


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # Installed, the units point at /opt/gpufleet; here at this checkout, whose venv
    # python exists, since verify checks that ExecStart's program does.
    for unit in ("gpufleet-reconcile.service", "gpufleet-reconcile.timer"):
        text = (UNITS / unit).read_text().replace("/opt/gpufleet", str(PROJECT))
        (tmp_path / unit).write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", *(str(p) for p in sorted(tmp_path.iterdir()))],
        capture_output=True,
        text=True,
        check=False,
    )
    # systemd only warns about keys or values it cannot parse: any output is a finding.
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")


def test_the_service_runs_one_local_cycle() -> None:
    service = (UNITS / "gpufleet-reconcile.service").read_text()
    exec_start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(
        exec_start.removeprefix("ExecStart=").replace("$GPUFLEET_RECONCILE_ARGS", "")
    )
    assert argv[1:3] == ["-m", "runner"]
    args = cli.build_parser().parse_args(argv[3:])
    assert (args.command, args.local, args.once) == ("reconcile", True, True)
    assert "SuccessExitStatus=130" in service, "a stop after the current batch is no failure"
