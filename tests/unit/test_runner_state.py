# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reconciler's state: private, versioned, bounded, and refused when unusable."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from runner.schema import _SCHEMA, _SCHEMA_2, _SCHEMA_3, _SCHEMA_4, _SCHEMA_5, SCHEMA_VERSION
from runner.state import (
    ClusterRecord,
    HistoryEntry,
    HostRecord,
    RolloutRecord,
    StateError,
    StateStore,
    state_dir_for,
)


def test_state_is_private_and_survives_a_reopen(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    with StateStore(directory) as store:
        store.save(HostRecord("a", status="converged", stages={"driver": "ready"}))
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "state.db").stat().st_mode) == 0o600
    with StateStore(directory) as store:
        assert store.host("a").stages == {"driver": "ready"}
        assert store.host("never-seen").status == "pending"


def test_history_is_bounded_to_the_newest_entries(tmp_path: Path) -> None:
    with StateStore(tmp_path, history_limit=10) as store:
        for n in range(25):
            store.record([HistoryEntry(float(n), "a", "drift", "toolkit", f"entry {n}")])
        entries = store.history(limit=100)
    assert [e.summary for e in entries] == [f"entry {n}" for n in range(15, 25)]


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    with StateStore(tmp_path):
        pass
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StateError, match="written by a newer runner"):
        StateStore(tmp_path).open()


def test_a_schema_1_database_gains_the_cluster_record_and_keeps_its_hosts(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.executescript(_SCHEMA)
    db.execute("INSERT INTO hosts (name, status) VALUES ('a', 'converged')")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with StateStore(tmp_path) as store:
        assert store.host("a").status == "converged"
        assert store.host("a").mig_layout == ""  # schema 3's column
        assert store.cluster() == ClusterRecord()
        store.save_cluster(ClusterRecord("failed", "api gone", owed_hosts=["a"], owed_objects=True))
    with StateStore(tmp_path) as store:
        assert store.cluster().owed_hosts == ["a"]
        assert store.cluster().owed_objects is True


def test_a_rollout_in_flight_under_schema_3_joins_the_default_pool(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.executescript(_SCHEMA + _SCHEMA_2 + _SCHEMA_3)
    db.execute(
        "INSERT INTO hosts (name, status, rollout_phase) VALUES ('a', 'converged', 'drained')"
    )
    db.execute("INSERT INTO hosts (name, status) VALUES ('b', 'converged')")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    with StateStore(tmp_path) as store:
        a, b = store.host("a"), store.host("b")
        assert (a.rollout_phase, a.rollout_pool, a.rollout_target) == ("drained", "all", None)
        assert (b.rollout_phase, b.rollout_pool) == (None, "")
        assert store.rollouts() == {}
        store.save_rollout(RolloutRecord("all", started=5.0, last_batch=7.0, done=["c"]))
    with StateStore(tmp_path) as store:
        assert store.rollouts() == {"all": RolloutRecord("all", 5.0, None, 7.0, ["c"])}


def test_another_programs_database_is_refused(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("CREATE TABLE photos (id INTEGER)")
    db.close()
    with pytest.raises(StateError, match="not the runner's"):
        StateStore(tmp_path).open()


def test_rebuild_keeps_the_unreadable_file_aside(tmp_path: Path) -> None:
    (tmp_path / "state.db").write_bytes(b"\x00garbage" * 512)
    store = StateStore(tmp_path, clock=lambda: 42.0)
    with pytest.raises(StateError, match="unreadable"):
        store.open()
    store.rebuild().close()
    assert (tmp_path / "state.db.unreadable-42").read_bytes().startswith(b"\x00garbage")
    with StateStore(tmp_path) as reopened:
        assert reopened.hosts() == {}


def test_a_failed_transaction_leaves_nothing_behind(tmp_path: Path) -> None:
    with StateStore(tmp_path) as store:
        store.save(HostRecord("a", status="converged"))
        bad = HistoryEntry(1.0, "a", "drift", "toolkit", None)  # type: ignore[arg-type]
        with pytest.raises(sqlite3.IntegrityError):
            store.save(HostRecord("a", status="failed"), [bad])
        assert store.host("a").status == "converged"
        assert store.history() == []


def test_each_inventory_has_its_own_directory(tmp_path: Path) -> None:
    one = state_dir_for(tmp_path, "/srv/site-a/hosts.yml")
    two = state_dir_for(tmp_path, "/srv/site-b/hosts.yml")
    assert one != two
    assert one.name.startswith("hosts.yml-")


def test_an_administrators_slurm_drain_under_schema_5_gets_its_own_field(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.executescript(_SCHEMA + _SCHEMA_2 + _SCHEMA_3 + _SCHEMA_4 + _SCHEMA_5)
    for name, drained in (("a", "admin: disk check"), ("b", "gpufleet"), ("c", "")):
        db.execute(
            "INSERT INTO hosts (name, status, rollout_phase, rollout_pool, slurm_drained) "
            "VALUES (?, 'drifted', 'drained', 'all', ?)",
            (name, drained),
        )
    db.execute("PRAGMA user_version = 5")
    db.commit()
    db.close()
    with StateStore(tmp_path) as store:
        found = {h: (r.slurm_drained, r.slurm_admin_reason) for h, r in store.hosts().items()}
    assert found == {"a": ("admin", "disk check"), "b": ("gpufleet", ""), "c": ("", "")}
