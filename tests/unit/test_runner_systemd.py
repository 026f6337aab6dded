# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shipped units (pull mode's on a node, the controller's loop) are accepted by
systemd and start a command the runner accepts."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from runner import cli

PROJECT = Path(__file__).resolve().parents[2]
UNITS = PROJECT / "src" / "runner" / "systemd"


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # Installed, the units point at /opt/gpufleet(-controller); here at this checkout,
    # whose venv exists, since verify checks that ExecStart's program does.
    for unit in ("gpufleet-reconcile.service", "gpufleet-reconcile.timer"):
        text = (UNITS / unit).read_text().replace("/opt/gpufleet", str(PROJECT))
        (tmp_path / unit).write_text(text)
    controller = (UNITS / "gpufleet-controller.service").read_text()
    controller = controller.replace("/opt/gpufleet-controller", str(PROJECT / ".venv"))
    (tmp_path / "gpufleet-controller.service").write_text(
        controller.replace("WorkingDirectory=/etc/gpufleet", f"WorkingDirectory={tmp_path}")
    )
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


def test_the_controller_service_runs_the_loop_and_is_not_pull_mode() -> None:
    service = (UNITS / "gpufleet-controller.service").read_text()
    exec_start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(
        exec_start.removeprefix("ExecStart=").replace("$GPUFLEET_RECONCILE_ARGS", "")
    )
    assert argv[0] == "/opt/gpufleet-controller/bin/gpufleet"
    args = cli.build_parser().parse_args(argv[1:])
    assert (args.command, args.local, args.once) == ("reconcile", False, False)
    assert "SuccessExitStatus=130" in service and "Restart=on-failure" in service
    rules = (
        PROJECT / "roles" / "k8s_manifests" / "files" / "monitoring" / "gpufleet-rules.yml"
    ).read_text()
    assert "systemctl status gpufleet-controller" in rules
    assert "gpufleet-reconcile" not in rules, "pull mode's unit serves no metrics"
