"""Command line of the gpufleet runner.

Today the runner only describes itself: one converge pass is
`ansible-playbook site.yml -i INVENTORY`. The reconcile loop (reconcile, plan,
status, history) is being built and is not offered until it works.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from runner import __version__

DESCRIPTION = (
    "Keep a fleet of NVIDIA GPU nodes converged. Until the reconcile loop lands, run one "
    "converge pass with: ansible-playbook site.yml -i inventories/<env>"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runner", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"gpufleet runner {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run; returns the process exit code."""
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help()
    return 0
