# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU remediation in the reconcile loop, on fake time with the fake Ansible of
test_runner_loop: a node whose GPUs ask for a reset or a reboot is taken out of service
within its pool's budget, remediated, applied, read again and returned; one asking for
a replacement (or asking again) is quarantined with its evidence; the circuit breaker
holds every remediation when too many hosts ask at once (runner.remedy)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from prometheus_client import generate_latest
from test_runner_health import A100, T4, reading, signal, xid
from test_runner_loop import converged, store, upgrade_driver  # noqa: F401 (a fixture)

from runner import health, show
from runner.metrics import Metrics
from runner.observe import Observers
from runner.reconcile import Reconciler
from runner.state import HistoryKind, HostStatus, StateStore

H100 = "0000:18:00.0"


def lost(address: str = H100, seq: int = 20, usec: int = 90_000) -> dict[str, Any]:
    """A GPU fallen off the bus: nvidia-smi cannot open it, and the driver logged Xid 79."""
    return reading(
        {address: [signal("lost", "reboot", "the GPU cannot be reached")]},
        [xid(seq, usec, 79, "reboot", address)],
    )


def summaries(store: StateStore, host: str, kind: HistoryKind) -> list[str]:  # noqa: F811
    return [e.summary for e in store.history(host) if e.kind == kind]


def test_a_lost_gpu_on_a_slurm_node_is_drained_rebooted_validated_and_returned(
    store: StateStore,  # noqa: F811
) -> None:
    reconciler, engine, _ = converged(store, "a", "b")
    metrics = Metrics()
    reconciler.observe = Observers([metrics])
    engine.slurm_nodes.update({"a", "b"})
    engine.nodes["a"].health = lost()
    report = reconciler.cycle()

    # Out of service with a reason naming the GPU and the signal, then the reboot, the
    # whole apply (the stages validate), the health read again, and back into Slurm.
    assert [c for c, _ in engine.calls] == ["probe", "remediate", "apply", "probe"]
    assert engine.remedies == [{"a": {"action": "reboot", "gpus": [H100]}}]
    assert engine.acted_on("apply") == ["a"]
    assert engine.slurm_calls == [("drain", ("a",)), ("resume", ("a",))]
    assert "a" not in engine.slurm_drained
    a = store.host("a")
    assert (a.status, a.rollout_phase, a.remedy, a.quarantined) == (
        HostStatus.CONVERGED,
        None,
        {},
        False,
    )
    assert a.remedied_at is not None
    assert summaries(store, "a", HistoryKind.HEALTH)[-1] == (
        "remediated by a reboot; health check passed"
    )
    assert report.outcomes["a"].action == "rolled-out"
    assert report.outcomes["a"].message == "remediated by a reboot; health check passed"
    assert store.host("b").rollout_phase is None and "b" not in engine.acted_on("apply")
    text = generate_latest(metrics.registry).decode()
    assert 'gpufleet_remediations_total{action="reboot",host="a",result="held"} 1.0' in text

    # The Xid is not read as new again: the next cycle only probes.
    engine.calls.clear()
    reconciler.cycle()
    assert [c for c, _ in engine.calls] == ["probe"]


def test_the_slurm_drain_reason_names_the_gpu_and_the_xid(store: StateStore) -> None:  # noqa: F811
    reconciler, engine, _ = converged(store, "a")
    engine.slurm_nodes.add("a")
    engine.slurm_jobs["a"] = ["4242"]  # a job holds the batch back: the reason stays
    engine.nodes["a"].health = lost()
    reconciler.cycle()
    reason = engine.slurm_drained["a"]
    assert reason.startswith(f"gpufleet: GPU {H100} reboot (lost: the GPU cannot be reached")
    assert "Xid 79 (the table's words)" in reason
    assert "remediate" not in [c for c, _ in engine.calls]
    assert store.host("a").rollout_reason.startswith("Slurm job(s) 4242 still running")


def test_a_kubernetes_node_is_cordoned_drained_reset_and_uncordoned(
    store: StateStore,  # noqa: F811
) -> None:
    reconciler, engine, _ = converged(store, "a")
    engine.nodes["a"].variables["k8s_manifests_apply"] = True
    reconciler.cycle()  # the cluster side applied once
    engine.calls.clear()
    engine.nodes["a"].health = reading({A100: []}, [xid(7, 4_000, 48, "reset", A100)])
    reconciler.cycle()
    calls = [c for c, _ in engine.calls]
    assert calls.index("cordon") < calls.index("drain") < calls.index("remediate")
    assert calls.index("remediate") < calls.index("apply") < calls.index("uncordon")
    assert engine.remedies == [{"a": {"action": "reset", "gpus": [A100]}}]
    assert engine.cordoned == set()
    # labelled with what its GPU asked as it was cordoned, the label gone as it is uncordoned
    assert engine.health_labelled == [("a", "reset")] and engine.health_labels == {}
    assert summaries(store, "a", HistoryKind.HEALTH)[-1] == (
        "remediated by a GPU reset; health check passed"
    )


def test_a_node_cordoned_by_an_administrator_stays_so_and_loses_only_the_health_label(
    store: StateStore,  # noqa: F811
) -> None:
    reconciler, engine, _ = converged(store, "a")
    engine.nodes["a"].variables["k8s_manifests_apply"] = True
    reconciler.cycle()
    engine.cordoned.add("a")  # kubectl cordon, before the GPU failed
    engine.nodes["a"].health = reading({A100: []}, [xid(7, 4_000, 79, "reboot", A100)])
    reconciler.cycle()
    assert engine.remedies == [{"a": {"action": "reboot", "gpus": [A100]}}]
    assert engine.cordoned == {"a"} and "uncordon" not in [c for c, _ in engine.calls]
    assert engine.health_labelled == [("a", "reboot")] and engine.health_labels == {}
    assert store.host("a").rollout_phase is None


def test_a_signal_asking_no_action_or_a_watch_changes_nothing(store: StateStore) -> None:  # noqa: F811
    reconciler, engine, _ = converged(store, "a")
    engine.slurm_nodes.add("a")
    engine.nodes["a"].health = reading(
        {T4: [signal("hw-slowdown", "watch", "clocks held down")]},
        [xid(3, 100, 13, "none", T4), xid(4, 200, 31, "watch", T4)],
    )
    reconciler.cycle()
    assert [c for c, _ in engine.calls] == ["probe"]
    assert engine.slurm_calls == [] and engine.remedies == []
    a = store.host("a")
    assert (a.remedy, a.status, a.rollout_phase) == ({}, HostStatus.CONVERGED, None)
    assert len(summaries(store, "a", HistoryKind.HEALTH)) == 3  # recorded, counted only


def test_a_remapping_failure_is_quarantined_with_its_evidence_and_never_returned(
    store: StateStore,  # noqa: F811
    capsys,
) -> None:
    reconciler, engine, clock = converged(store, "a")
    metrics = Metrics()
    reconciler.observe = Observers([metrics])
    engine.slurm_nodes.add("a")
    engine.nodes["a"].health = reading(
        {H100: [signal("remap-failure", "replace", "remapped_rows.failure is Yes")]}
    )
    engine.nodes["a"].health["gpus"][H100] |= {"uuid": "GPU-5e1d", "serial": "1654822007312"}
    reconciler.cycle()
    a = store.host("a")
    assert a.quarantined and a.rollout_phase == "halted"
    assert a.remedy["action"] == "replace"
    assert a.remedy["gpus"] == {H100: ["remap-failure: remapped_rows.failure is Yes"]}
    assert engine.remedies == [] and "apply" not in [c for c, _ in engine.calls]
    assert engine.slurm_drained["a"].startswith(f"gpufleet: GPU {H100} replace (remap-failure")
    identity = f"[GPU {H100}: uuid GPU-5e1d, serial 1654822007312]"
    assert identity not in engine.slurm_drained["a"]  # Slurm's reason stays short
    (entry,) = summaries(store, "a", HistoryKind.QUARANTINE)
    assert entry.startswith(f"GPU quarantined: replace asked (GPU {H100}: remap-failure")
    assert identity in entry and entry.endswith("python -m runner release a")
    text = generate_latest(metrics.registry).decode()
    assert 'gpufleet_remediations_total{action="replace",host="a",result="quarantined"}' in text
    assert 'gpufleet_host_quarantined{host="a"} 1.0' in text

    # Cycles later it is still out: not probed, not resumed, not remediated.
    for _ in range(3):
        clock.sleep(3600)
        engine.calls.clear()
        reconciler.cycle()
        assert engine.calls == []
    assert "a" in engine.slurm_drained
    show.print_status(store.hosts(), store.cluster(), store.rollouts(), clock())
    out = capsys.readouterr().out
    assert f"quarantined for its GPUs (replace asked (GPU {H100}: remap-failure" in out
    assert identity in out
    assert show.unwell(store.host("a"))


def test_two_hosts_of_a_pool_with_a_budget_of_one_are_remediated_one_at_a_time(
    store: StateStore,  # noqa: F811
) -> None:
    reconciler, engine, _ = converged(store, "a", "b", "c")
    metrics = Metrics()
    reconciler.observe = Observers([metrics])
    for host in ("a", "b"):
        engine.nodes[host].health = lost()
    report = reconciler.cycle()
    assert engine.remedies == [{"a": {"action": "reboot", "gpus": [H100]}}]
    assert store.host("b").rollout_phase == "queued"
    assert report.outcomes["b"].message == "rollout: queued for a later batch"
    # b's reboot is under way (queued): its GPUs' alert waits (docs/monitoring.md).
    assert remediating(metrics) == {"a": 0.0, "b": 1.0, "c": 0.0}
    engine.calls.clear()
    reconciler.cycle()
    assert engine.remedies[1:] == [{"b": {"action": "reboot", "gpus": [H100]}}]
    assert all(store.host(h).rollout_phase is None for h in ("a", "b", "c"))
    assert all(store.host(h).remedy == {} for h in ("a", "b"))
    assert remediating(metrics) == {"a": 0.0, "b": 0.0, "c": 0.0}


def remediating(metrics: Metrics) -> dict[str, float]:
    """gpufleet_host_gpu_remediation per host, as exported."""
    text = generate_latest(metrics.registry).decode()
    found = re.findall(r'^gpufleet_host_gpu_remediation\{host="([^"]+)"\} (\S+)$', text, re.M)
    return {host: float(value) for host, value in found}


def test_a_burst_across_the_fleet_trips_the_breaker_and_remediates_nothing(
    store: StateStore,  # noqa: F811
) -> None:
    reconciler, engine, _ = converged(store, "a", "b", "c", "d")
    metrics = Metrics()
    reconciler.observe = Observers([metrics])
    for host in ("a", "b", "c"):
        engine.slurm_nodes.add(host)
        engine.nodes[host].health = lost()
    report = reconciler.cycle()
    assert engine.remedies == [] and engine.slurm_calls == []
    assert report.health_held.startswith("3 hosts ask for a GPU reset or a reboot at once")
    assert report.outcomes["a"].message.startswith("GPU remediation held: 3 hosts")
    assert all(store.host(h).remedy["action"] == "reboot" for h in ("a", "b", "c"))
    assert all(store.host(h).rollout_phase is None for h in ("a", "b", "c"))
    assert "gpufleet_health_breaker_open 1.0" in generate_latest(metrics.registry).decode()
    # Held, not under way: each host's own alert pages too.
    assert set(remediating(metrics).values()) == {0.0}

    # Still held next cycle: what each owes is kept.
    engine.calls.clear()
    assert reconciler.cycle().health_held and engine.remedies == []

    # The operator sees to one (power-cycles it by hand, then releases it): two owe,
    # under the breaker's three. (Released while still lost, it would owe again.)
    engine.nodes["c"].health = reading({H100: []}, lost()["xid_events"])
    reconciler.ctx.writer.release("c")
    report = reconciler.cycle()
    assert report.health_held == ""
    assert engine.remedies == [{"a": {"action": "reboot", "gpus": [H100]}}]
    assert "gpufleet_health_breaker_open 0.0" in generate_latest(metrics.registry).decode()


def test_a_gpu_asking_again_soon_after_its_remediation_is_quarantined(
    store: StateStore,  # noqa: F811
) -> None:
    reconciler, engine, clock = converged(store, "a")
    engine.nodes["a"].health = reading({A100: []}, [xid(7, 4_000, 48, "reset", A100)])
    reconciler.cycle()
    assert store.host("a").remedied_at is not None
    clock.sleep(3600)  # within the day's window
    engine.nodes["a"].health = reading({A100: []}, [xid(9, 9_000, 48, "reset", A100)])
    reconciler.cycle()
    a = store.host("a")
    assert a.quarantined and a.remedy["action"] == "replace"
    assert a.remedy["why"] == "asked again 3600 s after its last remediation"
    assert len(engine.remedies) == 1

    # Released, and asking again a day and more later: remediated anew.
    reconciler.ctx.writer.release("a")
    reconciler.cycle()
    clock.sleep(2 * 86400)
    engine.nodes["a"].health = reading({A100: []}, [xid(12, 99_000, 48, "reset", A100)])
    reconciler.cycle()
    assert len(engine.remedies) == 2 and not store.host("a").quarantined


def test_a_gpu_still_asking_after_its_remediation_is_quarantined(store: StateStore) -> None:  # noqa: F811
    reconciler, engine, _ = converged(store, "a")
    engine.slurm_nodes.add("a")
    engine.nodes["a"].variables["k8s_manifests_apply"] = True
    reconciler.cycle()  # the cluster side applied once
    engine.nodes["a"].health = lost()
    engine.nodes["a"].health_after_remedy = lost(seq=2, usec=95_000)  # lost again at boot
    reconciler.cycle()
    a = store.host("a")
    assert a.quarantined and a.remedy["why"] == "asked again right after its reboot"
    assert "a" in engine.slurm_drained  # never resumed
    assert engine.cordoned == {"a"}  # never uncordoned
    # taken out for a reboot, quarantined: its label says it now asks for a replacement
    assert engine.health_labelled == [("a", "reboot"), ("a", "replace")]
    assert summaries(store, "a", HistoryKind.QUARANTINE)[0].startswith("GPU quarantined")


def test_a_remediation_that_fails_halts_the_host_out_of_service(store: StateStore) -> None:  # noqa: F811
    reconciler, engine, _ = converged(store, "a")
    engine.slurm_nodes.add("a")
    engine.nodes["a"].health = lost()
    engine.nodes["a"].remedy_failure = (
        "driver: Leave the node out of service until it is rebooted: a needs a reboot to "
        "recover GPU 0000:18:00.0; driver_reboot_policy is never"
    )
    reconciler.cycle()
    a = store.host("a")
    assert a.rollout_phase == "halted" and "driver_reboot_policy is never" in a.rollout_reason
    assert a.remedy["action"] == "reboot"  # still owed
    assert "apply" not in [c for c, _ in engine.calls] and "a" in engine.slurm_drained


def test_check_only_records_what_is_owed_and_touches_nothing(store: StateStore) -> None:  # noqa: F811
    reconciler, engine, _ = converged(store, "a")
    reconciler.ctx.settings = replace(reconciler.settings, check_only=True)
    engine.slurm_nodes.add("a")
    engine.nodes["a"].health = lost()
    reconciler.cycle()
    assert engine.remedies == [] and engine.slurm_calls == []
    assert store.host("a").remedy["action"] == "reboot"


def test_owed_merges_what_is_asked_and_keeps_the_worst_action() -> None:
    first = health.owed(None, health.asking(lost(), []), 10.0, None, 86400)
    assert first == health.Remedy("reboot", {H100: ["lost: the GPU cannot be reached"]}, 10.0)
    ecc = health.asking(reading({A100: [signal("ecc-dbe", "reset", "2 since load")]}), [])
    merged = health.owed(first, ecc, 20.0, None, 86400)
    assert merged is not None and merged.action == "reboot" and merged.since == 10.0
    assert sorted(merged.gpus) == [H100, A100]
    assert health.owed(merged, [], 30.0, None, 86400) == merged  # an Xid is read once
    assert health.Remedy.of(merged.stored()) == merged
    assert health.Remedy.of({}) is None


def test_the_breaker_opens_at_its_threshold_and_never_at_zero() -> None:
    assert not health.breaker_open(2, 3)
    assert health.breaker_open(3, 3)
    assert not health.breaker_open(100, 0)


def test_a_new_reconciler_resumes_a_remediation_owed(store: StateStore) -> None:  # noqa: F811
    """What is owed is stored: a reconciler stopped after the probe, before the batch,
    remediates it after a restart though the Xid is not new any more."""
    reconciler, engine, clock = converged(store, "a")
    engine.nodes["a"].health = lost()
    reconciler.ctx.settings = replace(reconciler.settings, check_only=True)
    reconciler.cycle()
    again = Reconciler(engine, store, replace(reconciler.settings, check_only=False), clock)
    again.cycle()
    assert engine.remedies == [{"a": {"action": "reboot", "gpus": [H100]}}]


def test_a_remediation_waits_while_a_change_holds_the_pools_budget(store: StateStore) -> None:  # noqa: F811
    """A host drained for a driver change (its job still running) is out of service:
    with a budget of one, a host of the same pool whose GPU is lost waits its turn."""
    reconciler, engine, _ = converged(store, "a", "b")
    engine.slurm_nodes.update({"a", "b"})
    engine.slurm_jobs["a"] = ["77"]
    upgrade_driver(engine, "a")
    reconciler.cycle()
    assert store.host("a").rollout_phase == "cordoned"
    engine.nodes["b"].health = lost()
    reconciler.cycle()
    assert engine.remedies == [] and "b" not in engine.slurm_drained
    assert store.host("b").rollout_phase == "queued"
    engine.slurm_jobs["a"] = []
    reconciler.cycle()  # a's change applied, a back in service
    assert store.host("a").rollout_phase is None and engine.remedies == []
    reconciler.cycle()
    assert engine.remedies == [{"b": {"action": "reboot", "gpus": [H100]}}]
    assert store.host("b").rollout_phase is None and "b" not in engine.slurm_drained


def test_a_released_quarantine_returns_the_node_once_its_gpu_is_seen_to(
    store: StateStore,  # noqa: F811
) -> None:
    """A Kubernetes and Slurm node quarantined for a remapping failure; the board
    replaced and the host released: the next cycle finds nothing to change, resumes it
    in Slurm and uncordons it."""
    reconciler, engine, _ = converged(store, "a")
    engine.nodes["a"].variables["k8s_manifests_apply"] = True
    engine.slurm_nodes.add("a")
    reconciler.cycle()
    engine.nodes["a"].health = reading(
        {H100: [signal("remap-failure", "replace", "remapped_rows.failure is Yes")]}
    )
    reconciler.cycle()
    assert store.host("a").quarantined and engine.cordoned == {"a"}
    assert engine.health_labels == {"a": "replace"}
    engine.nodes["a"].health = reading({H100: []})  # the board replaced
    reconciler.ctx.writer.release("a")
    reconciler.cycle()
    a = store.host("a")
    assert (a.quarantined, a.rollout_phase, a.remedy) == (False, None, {})
    assert engine.cordoned == set() and "a" not in engine.slurm_drained
    assert engine.health_labels == {}
    [done] = [e.summary for e in store.history("a") if e.component == "done"][-1:]
    assert done == "left the rollout: nothing to change any more; resumed in Slurm; uncordoned"
