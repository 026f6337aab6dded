# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The state database's tables: the first schema and each migration from one version to
the next (runner.state opens, creates and migrates with them)."""

SCHEMA_VERSION = 10

_SCHEMA = """
CREATE TABLE hosts (
    name TEXT PRIMARY KEY,
    status TEXT NOT NULL DEFAULT 'unknown',
    desired_hash TEXT,
    stages TEXT NOT NULL DEFAULT '{}',
    failed_stage TEXT,
    reason TEXT NOT NULL DEFAULT '',
    drift TEXT NOT NULL DEFAULT '[]',
    last_reconcile REAL,
    last_change REAL,
    last_full_check REAL,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL,
    quarantined INTEGER NOT NULL DEFAULT 0,
    rollout_phase TEXT,
    rollout_reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE history (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    host TEXT NOT NULL,
    kind TEXT NOT NULL,
    component TEXT NOT NULL DEFAULT '',
    summary TEXT NOT NULL DEFAULT ''
);
CREATE INDEX history_host ON history (host, id);
"""
# Schema 2: the cluster side's record (one row); whether a host's Node was cordoned
# by someone else before a rollout (it stays cordoned after).
_SCHEMA_2 = """
ALTER TABLE hosts ADD COLUMN keep_cordoned INTEGER NOT NULL DEFAULT 0;
CREATE TABLE cluster (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    status TEXT NOT NULL DEFAULT 'unknown',
    reason TEXT NOT NULL DEFAULT '',
    drift TEXT NOT NULL DEFAULT '[]',
    owed_hosts TEXT NOT NULL DEFAULT '[]',
    owed_objects INTEGER NOT NULL DEFAULT 0,
    last_apply REAL
);
"""
# Schema 3: the MIG layout a host's last run left.
_SCHEMA_3 = """
ALTER TABLE hosts ADD COLUMN mig_layout TEXT NOT NULL DEFAULT '';
"""
# Schema 4: rollouts that advance a batch per cycle. A host in one remembers its pool
# and the desired state its change was planned for; each pool's rollout keeps when
# it started and finished, when its last batch ended and the hosts it has done.
_SCHEMA_4 = """
ALTER TABLE hosts ADD COLUMN rollout_pool TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN rollout_target TEXT;
CREATE TABLE rollouts (
    pool TEXT PRIMARY KEY,
    started REAL NOT NULL,
    finished REAL,
    last_batch REAL,
    done TEXT NOT NULL DEFAULT '[]'
);
UPDATE hosts SET rollout_pool = 'all' WHERE rollout_phase IS NOT NULL;
"""
# Schema 5: the node's state in Slurm as the last run that reached it saw it; who
# drained it in Slurm for a rollout, and since when.
_SCHEMA_5 = """
ALTER TABLE hosts ADD COLUMN slurm_state TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN slurm_drained TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN slurm_drain_started REAL;
"""
# Schema 6: an administrator's Slurm drain in a field of its own (it was kept as
# slurm_drained = 'admin: <reason>').
_SCHEMA_6 = """
ALTER TABLE hosts ADD COLUMN slurm_admin_reason TEXT NOT NULL DEFAULT '';
UPDATE hosts SET slurm_admin_reason = substr(slurm_drained, 8), slurm_drained = 'admin'
    WHERE slurm_drained LIKE 'admin: %';
"""
# Schema 7: a driver the driver stage adopted from the node (HostRecord.driver_adopted).
_SCHEMA_7 = """
ALTER TABLE hosts ADD COLUMN driver_adopted TEXT NOT NULL DEFAULT '';
"""
# The last probe's GPU health (runner.health.stored) and the newest Xid event recorded.
_SCHEMA_8 = """
ALTER TABLE hosts ADD COLUMN health TEXT NOT NULL DEFAULT '{}';
ALTER TABLE hosts ADD COLUMN xid_seen TEXT NOT NULL DEFAULT '{}';
"""
# Schema 9: the remediation a host's GPUs ask for (runner.health.Remedy, as a dict) and
# when its last one was validated.
_SCHEMA_9 = """
ALTER TABLE hosts ADD COLUMN remedy TEXT NOT NULL DEFAULT '{}';
ALTER TABLE hosts ADD COLUMN remedied_at REAL;
"""
# Schema 10: the node's operating system and the driver it runs, as the last run that
# reached it read them (HostRecord.os, HostRecord.driver_version).
_SCHEMA_10 = """
ALTER TABLE hosts ADD COLUMN os TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN driver_version TEXT NOT NULL DEFAULT '';
"""

# From schema N to N + 1; a new database runs all of them after _SCHEMA.
_MIGRATIONS = dict(
    enumerate(
        (
            _SCHEMA_2,
            _SCHEMA_3,
            _SCHEMA_4,
            _SCHEMA_5,
            _SCHEMA_6,
            _SCHEMA_7,
            _SCHEMA_8,
            _SCHEMA_9,
            _SCHEMA_10,
        ),
        1,
    )
)
