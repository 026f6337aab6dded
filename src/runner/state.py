# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The runner's memory: one SQLite database per inventory, in a private state directory.

What it keeps, per host: the desired state (a hash) the last successful apply
reached, the last probe's drift, each stage's status, failures, backoff and
quarantine, and the host's phase in a disruptive rollout. For the cluster side (when
the inventory applies it): its status and what a failed apply still owes. Plus a
bounded history of what happened (drift repaired, intentional changes, failures).
Every write is a transaction: a reconciler stopped mid-cycle leaves the database as
the last completed step left it.

The schema is versioned with SQLite's `user_version`; a database written by a newer
runner is refused rather than misread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from runner.rollout import RolloutPhase
from runner.schema import _MIGRATIONS, _SCHEMA, SCHEMA_VERSION

DATABASE_NAME = "state.db"
DEFAULT_HISTORY_LIMIT = 5000


class StateError(Exception):
    """The state database cannot be used; the message says why and what to do."""


class HostStatus(StrEnum):
    """Where a host is, as the last cycle that looked at it found it."""

    CONVERGED = "converged"
    # Drift or a change is pending (a check-only cycle found it, or it waits for a
    # rollout).
    DRIFTED = "drifted"
    FAILED = "failed"
    # Its inventory settings are refused: the node is left alone until they are fixed.
    REFUSED = "refused"
    UNREACHABLE = "unreachable"
    REBOOT_REQUIRED = "reboot-required"
    NOT_A_GPU_NODE = "not-a-gpu-node"
    # A disruptive change is pending, but gpufleet_rollout_exclude keeps it out.
    EXCLUDED = "excluded"
    # Never reconciled.
    PENDING = "pending"


class SlurmDrain(StrEnum):
    """Who has a node in a rollout drained in Slurm."""

    NONE = ""  # not a Slurm node, or not drained yet
    GPUFLEET = "gpufleet"  # resumed after its change
    ADMIN = "admin"  # an administrator's drain, left as it is (slurm_admin_reason says why)


class ClusterStatus(StrEnum):
    UNKNOWN = "unknown"  # never applied
    CONVERGED = "converged"
    DRIFTED = "drifted"
    FAILED = "failed"


class HistoryKind(StrEnum):
    """What a history entry tells of."""

    CORRECTIVE = "corrective"  # drift repaired
    INTENTIONAL = "intentional"  # changed because the desired state did
    DRIFT = "drift"
    FAILURE = "failure"
    UNREACHABLE = "unreachable"
    QUARANTINE = "quarantine"
    RELEASE = "release"
    ROLLOUT = "rollout"
    HEALTH = "health"  # a GPU's health changed, or the driver logged an Xid


@dataclass
class HostRecord:
    """What the runner knows about one host."""

    name: str
    status: HostStatus = HostStatus.PENDING
    # Hash of the desired state (inventory variables + project files) that the last
    # successful apply reached; None until one has.
    desired_hash: str | None = None
    # stage name -> status from the last run that reached the host.
    stages: dict[str, str] = field(default_factory=dict)
    failed_stage: str | None = None
    reason: str = ""
    # The last probe's differences: [{component, kind, name, recorded, current}].
    drift: list[dict[str, Any]] = field(default_factory=list)
    last_reconcile: float | None = None
    last_change: float | None = None
    last_full_check: float | None = None
    consecutive_failures: int = 0
    next_attempt: float | None = None
    quarantined: bool = False
    # Disruptive rollout: None, or the host's phase in its pool's rollout.
    rollout_phase: RolloutPhase | None = None
    rollout_reason: str = ""
    # The pool whose rollout the host is in, and the desired state its change was
    # planned for (the host is planned again only when that changes).
    rollout_pool: str = ""
    rollout_target: str | None = None
    # The host's Node was already cordoned (by someone else) when its rollout began:
    # the rollout leaves it cordoned.
    keep_cordoned: bool = False
    # The MIG layout (mig_config) the last run that reached the host left on it; ''
    # where gpufleet leaves MIG alone.
    mig_layout: str = ""
    # The node's state in Slurm (IDLE, MIXED, DRAIN, ...) as the slurm_gres stage of the
    # last run that reached it read it; '' where gpufleet does not manage Slurm's GRES.
    slurm_state: str = ""
    # In a rollout, who has the node drained in Slurm (gpufleet resumes only its own
    # drain) and when gpufleet began waiting for its jobs; an administrator's reason.
    slurm_drained: SlurmDrain = SlurmDrain.NONE
    slurm_drain_started: float | None = None
    slurm_admin_reason: str = ""
    # The driver stage's note on a driver it adopted from the node where the defaults
    # would install another; '' otherwise.
    driver_adopted: str = ""
    # The node's operating system ("debian 13") and the driver version it runs, as the
    # last run that reached it read them; '' where none has (or no driver answers).
    os: str = ""
    driver_version: str = ""
    # The GPUs' health as the last probe read it (runner.health.stored): {} unknown.
    health: dict[str, Any] = field(default_factory=dict)
    # The newest Xid event recorded in the history ({boot, usec, seq}), so each counts once.
    xid_seen: dict[str, Any] = field(default_factory=dict)
    # The remediation the GPUs ask for (runner.health.Remedy.stored): {} when none is
    # owed; kept, with its evidence, while the host is quarantined for its GPUs.
    remedy: dict[str, Any] = field(default_factory=dict)
    # When its last remediation was validated: a GPU asking again soon after is
    # quarantined rather than remediated again.
    remedied_at: float | None = None


@dataclass
class ClusterRecord:
    """What the runner knows about the cluster side."""

    status: ClusterStatus = ClusterStatus.UNKNOWN
    reason: str = ""
    # The last cluster probe's differences: [{component, kind, name, host, ...}].
    drift: list[dict[str, Any]] = field(default_factory=list)
    # What a failed cluster apply still owes: the hosts whose Node labels it did not
    # apply, and whether the cluster objects themselves are to be applied again.
    owed_hosts: list[str] = field(default_factory=list)
    owed_objects: bool = False
    last_apply: float | None = None


@dataclass
class RolloutRecord:
    """One pool's rollout: it starts when a host of the pool is queued and finishes
    when none is left in it (queued, out of service or halted)."""

    pool: str
    started: float
    finished: float | None = None
    # When its last batch ended (the pause between batches counts from there).
    last_batch: float | None = None
    # Hosts it has taken through, in order.
    done: list[str] = field(default_factory=list)


# The name the cluster side's history entries carry in place of a host.
CLUSTER_SUBJECT = "(cluster)"


@dataclass(frozen=True)
class HistoryEntry:
    at: float
    host: str
    # A HistoryKind (stored and read back as its value).
    kind: str
    component: str
    summary: str


_JSON_FIELDS = ("stages", "drift", "health", "xid_seen", "remedy")


def _row_to_host(row: sqlite3.Row) -> HostRecord:
    values = dict(row)
    for key in _JSON_FIELDS:
        values[key] = json.loads(values[key])
    values["quarantined"] = bool(values["quarantined"])
    values["keep_cordoned"] = bool(values["keep_cordoned"])
    values["status"] = HostStatus(values["status"])
    values["slurm_drained"] = SlurmDrain(values["slurm_drained"])
    if values["rollout_phase"] is not None:
        values["rollout_phase"] = RolloutPhase(values["rollout_phase"])
    return HostRecord(**values)


def state_dir_for(base: Path, inventory: str) -> Path:
    """The state directory of one inventory under `base` (one database per inventory)."""
    resolved = str(Path(inventory).resolve())
    tag = hashlib.sha256(resolved.encode()).hexdigest()[:10]
    return base / f"{Path(resolved).name or 'inventory'}-{tag}"


def ensure_private_dir(path: Path) -> None:
    """Create `path` (and parents) and make it readable by its owner only."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


class StateStore:
    """The SQLite database of one inventory. Use as a context manager."""

    def __init__(
        self,
        directory: Path,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        clock: Any = time.time,
    ) -> None:
        self.directory = directory
        self.path = directory / DATABASE_NAME
        self.history_limit = history_limit
        self._clock = clock
        self._db: sqlite3.Connection | None = None

    # -- opening -----------------------------------------------------------------

    def open(self) -> StateStore:
        ensure_private_dir(self.directory)
        try:
            db = sqlite3.connect(self.path, isolation_level=None, timeout=10)
            db.row_factory = sqlite3.Row
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as err:
            raise StateError(
                f"state database {self.path} is unreadable ({err}); move it away or run "
                "with --rebuild-state to start a new one (hosts are then probed and "
                "planned afresh; nothing on them is changed by the rebuild itself)"
            ) from err
        os.chmod(self.path, 0o600)
        if version == 0:
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables:
                db.close()
                raise StateError(f"{self.path} is an SQLite database but not the runner's")
            with _transaction(db):
                # One statement at a time: executescript() would commit on its own.
                script = _SCHEMA + "".join(_MIGRATIONS[step] for step in sorted(_MIGRATIONS))
                for statement in filter(str.strip, script.split(";")):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version < SCHEMA_VERSION:
            with _transaction(db):
                for step in range(version, SCHEMA_VERSION):
                    for statement in filter(str.strip, _MIGRATIONS[step].split(";")):
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version > SCHEMA_VERSION:
            db.close()
            raise StateError(
                f"state database {self.path} has schema {version}, written by a newer "
                f"runner (this one reads schema {SCHEMA_VERSION}); upgrade the runner"
            )
        self._db = db
        return self

    def rebuild(self) -> StateStore:
        """Move an unusable database aside (kept for inspection) and start a new one."""
        if self.path.exists():
            aside = self.path.with_name(f"{DATABASE_NAME}.unreadable-{int(self._clock())}")
            self.path.replace(aside)
        return self.open()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> StateStore:
        return self if self._db is not None else self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise StateError("state database is not open")
        return self._db

    # -- hosts -------------------------------------------------------------------

    def hosts(self) -> dict[str, HostRecord]:
        rows = self.db.execute("SELECT * FROM hosts ORDER BY name").fetchall()
        return {row["name"]: _row_to_host(row) for row in rows}

    def host(self, name: str) -> HostRecord:
        row = self.db.execute("SELECT * FROM hosts WHERE name = ?", (name,)).fetchone()
        return _row_to_host(row) if row else HostRecord(name=name)

    def save(self, record: HostRecord, events: Sequence[HistoryEntry] = ()) -> None:
        """Store one host's record and its history entries in one transaction."""
        values = asdict(record)
        for key in _JSON_FIELDS:
            values[key] = json.dumps(values[key], sort_keys=True)
        values["quarantined"] = int(values["quarantined"])
        values["keep_cordoned"] = int(values["keep_cordoned"])
        columns = ", ".join(values)
        marks = ", ".join(f":{key}" for key in values)
        with _transaction(self.db):
            self.db.execute(f"INSERT OR REPLACE INTO hosts ({columns}) VALUES ({marks})", values)
            self._append(events)

    def forget_missing(self, names: Sequence[str]) -> list[str]:
        """Drop hosts that are no longer in the inventory; returns their names."""
        known = set(self.hosts())
        gone = sorted(known - set(names))
        with _transaction(self.db):
            for name in gone:
                self.db.execute("DELETE FROM hosts WHERE name = ?", (name,))
        return gone

    # -- the cluster side --------------------------------------------------------

    def cluster(self) -> ClusterRecord:
        row = self.db.execute("SELECT * FROM cluster WHERE id = 1").fetchone()
        if row is None:
            return ClusterRecord()
        values = dict(row)
        values.pop("id")
        for key in ("drift", "owed_hosts"):
            values[key] = json.loads(values[key])
        values["owed_objects"] = bool(values["owed_objects"])
        values["status"] = ClusterStatus(values["status"])
        return ClusterRecord(**values)

    def save_cluster(self, record: ClusterRecord, events: Sequence[HistoryEntry] = ()) -> None:
        values = asdict(record)
        for key in ("drift", "owed_hosts"):
            values[key] = json.dumps(values[key], sort_keys=True)
        values["owed_objects"] = int(values["owed_objects"])
        columns = ", ".join(values)
        marks = ", ".join(f":{key}" for key in values)
        with _transaction(self.db):
            self.db.execute(
                f"INSERT OR REPLACE INTO cluster (id, {columns}) VALUES (1, {marks})", values
            )
            self._append(events)

    # -- rollouts ----------------------------------------------------------------

    def rollouts(self) -> dict[str, RolloutRecord]:
        rows = self.db.execute("SELECT * FROM rollouts ORDER BY pool").fetchall()
        found = {}
        for row in rows:
            values = dict(row)
            values["done"] = json.loads(values["done"])
            found[row["pool"]] = RolloutRecord(**values)
        return found

    def save_rollout(self, record: RolloutRecord) -> None:
        values = asdict(record)
        values["done"] = json.dumps(values["done"])
        columns = ", ".join(values)
        marks = ", ".join(f":{key}" for key in values)
        with _transaction(self.db):
            self.db.execute(f"INSERT OR REPLACE INTO rollouts ({columns}) VALUES ({marks})", values)

    # -- history -----------------------------------------------------------------

    def record(self, events: Sequence[HistoryEntry]) -> None:
        with _transaction(self.db):
            self._append(events)

    def _append(self, events: Sequence[HistoryEntry]) -> None:
        if not events:
            return
        self.db.executemany(
            "INSERT INTO history (at, host, kind, component, summary) VALUES (?, ?, ?, ?, ?)",
            [(e.at, e.host, e.kind, e.component, e.summary) for e in events],
        )
        # Bounded: only the newest `history_limit` entries are kept.
        self.db.execute(
            "DELETE FROM history WHERE id <= (SELECT max(id) FROM history) - ?",
            (self.history_limit,),
        )

    def history(
        self, host: str | None = None, limit: int = 50, kinds: Sequence[str] = ()
    ) -> list[HistoryEntry]:
        query = "SELECT at, host, kind, component, summary FROM history"
        where: list[str] = []
        params: list[Any] = []
        if host:
            where.append("host = ?")
            params.append(host)
        if kinds:
            where.append(f"kind IN ({', '.join('?' for _ in kinds)})")
            params.extend(kinds)
        if where:
            query += " WHERE " + " AND ".join(where)
        query += " ORDER BY id DESC LIMIT ?"
        params.append(limit)
        rows = self.db.execute(query, params).fetchall()
        return [HistoryEntry(**dict(row)) for row in reversed(rows)]

    def counts(self) -> Mapping[str, int]:
        rows = self.db.execute("SELECT kind, count(*) FROM history GROUP BY kind").fetchall()
        return {row[0]: row[1] for row in rows}


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
