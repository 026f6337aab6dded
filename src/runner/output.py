# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the command line promises scripts (docs/cli.md): its exit codes, the one JSON
envelope every `--json` prints, and the name it goes by."""

from __future__ import annotations

import json
import sys
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

# Raised when a document's fields change in a way a reader must know of: a field
# removed, renamed or given another meaning. New fields do not raise it.
SCHEMA_VERSION = 1


class Exit(IntEnum):
    """The exit codes, the same with and without --json."""

    OK = 0
    FAILED = 1  # a host failed, is unreachable, quarantined, waits for a reboot or halted a rollout
    USAGE = 2  # bad arguments, inventory or settings; nothing was touched
    LOCKED = 3  # another reconciler works on this inventory
    STATE = 4  # the state database cannot be used
    PENDING = 5  # plan / reconcile --check: changes are pending
    ENGINE = 6  # Ansible could not be run, or its run not read, in the middle of a cycle
    INTERRUPTED = 130  # stopped by SIGINT or SIGTERM after the current batch


EXIT_TEXT = """exit codes (the same with --json): 0 done (fleet converged, or nothing to
do); 1 a host failed, is unreachable, quarantined or waiting for a reboot, or a
rollout halted; 2 bad arguments, inventory or settings (nothing touched); 3 another
reconciler holds the inventory's lock; 4 the state database is unusable; 5 (plan,
reconcile --check) changes are pending; 6 Ansible could not be run in the middle
of a cycle; 130 stopped by a signal after the current batch."""


class Kind(StrEnum):
    """What a JSON document holds: the verb that printed it, or an error."""

    RECONCILE = "reconcile"
    PLAN = "plan"
    STATUS = "status"
    HISTORY = "history"
    RELEASE = "release"
    VERSION = "version"
    MONITORING = "monitoring"
    ERROR = "error"


def document(kind: Kind, data: Any) -> str:
    """The envelope of every --json output: {schema_version, kind, data}."""
    return json.dumps(
        {"schema_version": SCHEMA_VERSION, "kind": str(kind), "data": data},
        indent=2,
        sort_keys=True,
    )


def program() -> str:
    """The name the command line was started by, for help and hints: `gpufleet` from
    the console script, else `python -m runner` (the module, or a program embedding it)."""
    started = Path(sys.argv[0]).name if sys.argv else ""
    return "gpufleet" if started == "gpufleet" else "python -m runner"
