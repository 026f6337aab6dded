# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPUs' health in the reconciler: what it keeps of each probe's reading, Xid
events counted once, the history, `status` and the metrics (runner.health, the writer);
the loop on the fake engine of test_runner_loop."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prometheus_client import generate_latest
from test_runner_loop import Node, converged, make, store  # noqa: F401 (a fixture)

from runner import health, show
from runner.metrics import Metrics
from runner.observe import Observers
from runner.state import HistoryKind, StateStore

A100 = "0000:af:00.0"
T4 = "0000:3b:00.0"


def signal(kind: str, action: str, detail: str) -> dict[str, str]:
    return {"kind": kind, "action": action, "detail": detail}


def reading(
    gpus: dict[str, list[dict[str, str]]] | None, events=(), boot: str = "boot-1"
) -> dict[str, Any]:
    """node_state's `health` for GPUs with these signals and these Xid events."""
    per_gpu = None
    if gpus is not None:
        per_gpu = {
            address: {
                "action": health.ACTIONS[
                    max((health.severity(s["action"]) for s in signals), default=0)
                ],
                "signals": signals,
            }
            for address, signals in gpus.items()
        }
    actions = [g["action"] for g in (per_gpu or {}).values()]
    return {
        "action": max(actions, key=health.severity, default="none"),
        "gpus": per_gpu,
        "xid_events": list(events),
        "boot_id": boot,
    }


def xid(seq: int, usec: int, code: int, action: str, address: str = A100) -> dict[str, Any]:
    return {
        "seq": seq,
        "usec": usec,
        "pci_address": address,
        "xid": code,
        "action": action,
        "meaning": "the table's words",
        "message": f"text of {code}",
    }


def test_the_runner_orders_actions_as_the_collection_does():
    from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_health

    assert health.ACTIONS == gpu_health.ACTIONS
    assert health.IDENTITY == gpu_health.IDENTITY_FIELDS


def test_only_gpus_with_signals_are_kept_and_an_unread_probe_keeps_nothing():
    kept = health.stored(reading({A100: [signal("remap-pending", "reset", "a row waits")], T4: []}))
    assert kept == {
        "action": "reset",
        "gpus": {
            A100: {
                "action": "reset",
                "signals": [{"kind": "remap-pending", "detail": "a row waits"}],
            }
        },
    }
    assert health.stored(reading(None)) == {}


def test_an_xid_event_is_new_once_and_a_new_boot_starts_over():
    first = [xid(10, 5_000, 48, "reset")]
    new, seen = health.new_events(reading({}, first), {})
    assert (new, seen) == (first, {"boot": "boot-1", "usec": 5_000, "seq": 10})
    again, seen = health.new_events(reading({}, first), seen)
    assert again == []
    later = [*first, xid(11, 9_000, 79, "reboot")]
    new, seen = health.new_events(reading({}, later), seen)
    assert [e["xid"] for e in new] == [79]
    # A reboot: the kernel numbers its records from 0 again, under a new boot id.
    rebooted = [xid(3, 1_000, 13, "none")]
    new, seen = health.new_events(reading({}, rebooted, boot="boot-2"), seen)
    assert ([e["xid"] for e in new], seen) == ([13], {"boot": "boot-2", "usec": 1_000, "seq": 3})
    # The log unreadable: nothing new, nothing forgotten.
    assert health.new_events({"xid_events": None, "boot_id": "boot-2"}, seen) == ([], seen)


def test_the_loop_keeps_health_records_it_and_shows_it(store: StateStore, capsys) -> None:  # noqa: F811
    metrics = Metrics()
    reconciler, engine, clock = converged(store, "a", "b")
    reconciler.observe = Observers([metrics])
    # Check only: what is read and kept, not the remediation (test_runner_remedy.py).
    reconciler.ctx.settings = replace(reconciler.settings, check_only=True)
    engine.nodes["a"].health = reading(
        {A100: [signal("remap-pending", "reset", "a memory row waits to be remapped")]},
        [xid(7, 4_000, 48, "reset")],
    )
    engine.nodes["b"].health = reading({T4: []})
    reconciler.cycle()
    a = store.host("a")
    assert a.health["action"] == "reset"
    assert a.xid_seen == {"boot": "boot-1", "usec": 4_000, "seq": 7}
    entries = [e for e in store.history() if e.kind == HistoryKind.HEALTH]
    assert [(e.host, e.component, e.summary) for e in entries] == [
        ("a", "xid", "Xid 48 on GPU 0000:af:00.0 asks reset (the table's words): text of 48"),
        ("a", "gpu", "GPU 0000:af:00.0 asks reset: a memory row waits to be remapped"),
        (
            "a",
            "remedy",
            "remediation owed: reset asked (GPU 0000:af:00.0: remap-pending: a memory row "
            "waits to be remapped, Xid 48 (the table's words))",
        ),
    ]
    assert store.host("b").health == {"action": "none", "gpus": {}}

    # The same reading again: nothing more in the history, the Xid counted once.
    reconciler.cycle()
    assert len([e for e in store.history() if e.kind == HistoryKind.HEALTH]) == 3
    text = generate_latest(metrics.registry).decode()
    xids = [line for line in text.splitlines() if line.startswith("gpufleet_xid_events_total")]
    assert xids == [
        'gpufleet_xid_events_total{action="reset",gpu="0000:af:00.0",host="a",xid="48"} 1.0'
    ], xids
    assert 'gpufleet_host_gpu_health{host="a"} 2.0' in text
    assert 'gpufleet_host_gpu_health{host="b"} 0.0' in text
    # Per GPU, only those with a signal (the reading names no UUID here).
    per_gpu = [line for line in text.splitlines() if line.startswith("gpufleet_gpu_health{")]
    assert per_gpu == ['gpufleet_gpu_health{gpu="0000:af:00.0",host="a",uuid=""} 2.0'], per_gpu

    show.print_status(store.hosts(), store.cluster(), store.rollouts(), clock())
    out = capsys.readouterr().out
    assert show.unwell(store.host("a")) and not show.unwell(store.host("b"))  # exit code
    assert "health=reset" in out.splitlines()[1]
    assert "GPU 0000:af:00.0 asks reset: a memory row waits to be remapped" in out

    # The remapping done (a reset by hand): the signal goes, and the history says so.
    engine.nodes["a"].health = reading({A100: []}, [xid(7, 4_000, 48, "reset")])
    reconciler.cycle()
    assert store.host("a").health == {"action": "none", "gpus": {}}
    assert [e.summary for e in store.history() if e.kind == HistoryKind.HEALTH][-1] == (
        "GPU 0000:af:00.0: no signal any more"
    )
    text = generate_latest(metrics.registry).decode()
    assert 'gpufleet_host_gpu_health{host="a"} 0.0' in text
    assert "gpufleet_gpu_health{" not in text


def test_a_lost_state_records_the_xid_events_in_the_log_and_acts_on_the_readings(
    store: StateStore,  # noqa: F811
    tmp_path,
) -> None:
    """The state directory lost after a GPU reset (no reboot: the Xid stays in the
    kernel log): the nodes' records say gpufleet converged them, so the events already
    in their logs were read by the reconciler that made those records. The new state
    records them and acts on none; what a GPU's readings ask now is acted on, and a
    node new to gpufleet is acted on for its log's events as before."""
    _, engine, clock = converged(store, "a", "b")
    engine.nodes["a"].health = reading({A100: []}, [xid(7, 4_000, 48, "reset")])
    engine.nodes["b"].health = reading({T4: [signal("remap-pending", "reset", "a row waits")]})
    engine.nodes["c"] = Node(health=reading({A100: []}, [xid(2, 900, 48, "reset")]))
    with StateStore(tmp_path / "new-state") as new:
        reconciler, _, _ = make(new, engine.nodes, clock)
        reconciler.ctx.settings = replace(reconciler.settings, check_only=True)
        reconciler.cycle()
        a, b, c = (new.host(h) for h in "abc")
        assert (a.xid_seen, a.remedy) == ({"boot": "boot-1", "usec": 4_000, "seq": 7}, {})
        entries = new.history("a", kinds=[HistoryKind.HEALTH])
        assert [(e.component, e.summary[:15]) for e in entries] == [("xid", "Xid 48 on GPU 0")]
        assert b.remedy["action"] == "reset"  # its readings ask
        assert c.remedy["action"] == "reset"  # a first run: its log's Xid asks


def test_what_is_owed_keeps_who_the_gpus_are_and_an_xid_takes_its_gpus():
    """The UUID and serial the probe read go with the evidence (a vendor asks for them
    when a GPU is sent back), also for an Xid, and are kept when the GPU is later lost
    and nvidia-smi can no longer say who it is."""
    first = reading({A100: [signal("ecc-dbe", "reset", "2 since the driver loaded")]})
    first["gpus"][A100] |= {"uuid": "GPU-a1", "serial": "1321"}
    first["gpus"][T4] = {"action": "none", "signals": [], "uuid": "GPU-t4", "serial": "1320"}
    assert health.stored(first)["gpus"][A100]["serial"] == "1321"
    assert T4 not in health.stored(first)["gpus"]  # healthy: nothing kept
    asked = health.asking(first, [xid(7, 100, 79, "reboot", T4)])
    assert [(a.address, a.identity) for a in asked] == [
        (A100, "uuid GPU-a1, serial 1321"),
        (T4, "uuid GPU-t4, serial 1320"),
    ]
    owed = health.owed(None, asked, 10.0, None, 0.0)
    assert owed is not None and owed.ids == {
        A100: "uuid GPU-a1, serial 1321",
        T4: "uuid GPU-t4, serial 1320",
    }
    lost = health.asking(reading({A100: [signal("lost", "reboot", "GPU is lost")]}), [])
    later = health.owed(health.Remedy.of(owed.stored()), lost, 20.0, None, 0.0)
    assert later is not None and later.ids == owed.ids
    assert later.evidence == (
        f"{later.text} [GPU {T4}: uuid GPU-t4, serial 1320; GPU {A100}: uuid GPU-a1, serial 1321]"
    )
    # Nothing read of who they are: the record is as before, and so is the text.
    bare = health.owed(None, lost, 20.0, None, 0.0)
    assert bare is not None and "ids" not in bare.stored() and bare.evidence == bare.text


def test_a_gpus_series_names_it_by_address_and_uuid_and_goes_with_its_host():
    from runner.observe import HostUpdated
    from runner.state import HostRecord

    metrics = Metrics()
    record = HostRecord("a")
    record.health = health.stored(
        {
            "action": "replace",
            "gpus": {
                A100: {
                    "action": "replace",
                    "signals": [signal("remap-failure", "replace", "no spare rows")],
                    "uuid": "GPU-0a1b",
                },
                T4: {"action": "watch", "signals": [signal("pcie-width", "watch", "x8 of x16")]},
            },
        }
    )
    metrics.host_updated(HostUpdated.of(record))
    text = generate_latest(metrics.registry).decode()
    assert 'gpufleet_gpu_health{gpu="0000:af:00.0",host="a",uuid="GPU-0a1b"} 4.0' in text
    assert 'gpufleet_gpu_health{gpu="0000:3b:00.0",host="a",uuid=""} 1.0' in text
    metrics.host_forgotten("a")
    assert "gpufleet_gpu_health{" not in generate_latest(metrics.registry).decode()
