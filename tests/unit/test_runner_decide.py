# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reconciler's decisions on their own: records, probe and plan results in,
verdicts out; no Ansible, no state database, no clock."""

from __future__ import annotations

import random
from typing import Any

import pytest

from runner import decide
from runner.cycle import Action, Settings
from runner.decide import Next, Situation, SlurmNext, Triage
from runner.engine import STAGES, Change, HostRun, ProbeResult
from runner.rollout import RolloutPhase, RolloutPolicy
from runner.state import HostRecord, HostStatus, RolloutRecord

NOW = 1_000_000.0
FILE_DRIFT = {"component": "toolkit", "kind": "file", "name": "/etc/x", "recorded": 1, "current": 2}
DRIVER_DRIFT = {
    "component": "driver",
    "kind": "driver",
    "name": "nvidia",
    "recorded": 1,
    "current": 2,
}


def converged(**fields: Any) -> HostRecord:
    """A host whose last apply reached desired state "v1"."""
    values: dict[str, Any] = {
        "status": HostStatus.CONVERGED,
        "desired_hash": "v1",
        "last_full_check": NOW,
        "stages": dict.fromkeys(STAGES, "ready"),
    }
    return HostRecord("a", **(values | fields))


def run(*changed: str, disruptive: bool = False, **fields: Any) -> HostRun:
    stages: dict[str, dict[str, Any]] = {s: {"status": "ready"} for s in STAGES}
    if disruptive:
        stages["driver"]["disruptive"] = True
    changes = [Change(c, f"change {c}") for c in changed]
    return HostRun("a", changes=changes, stages=stages, **fields)


# -- due and candidates ----------------------------------------------------------------


def test_a_host_is_skipped_while_applying_quarantined_or_backing_off() -> None:
    assert decide.skip_reason(converged(), NOW, None) is None
    assert decide.skip_reason(converged(), NOW, NOW - 30) == "rollout: its change applying (30 s)"
    assert decide.skip_reason(converged(quarantined=True), NOW, None) == "quarantined"
    later = converged(next_attempt=NOW + 90)
    assert decide.skip_reason(later, NOW, None) == "backing off (90 s left)"
    assert decide.skip_reason(converged(next_attempt=NOW - 1), NOW, None) is None


def test_a_probed_host_is_a_candidate_for_each_reason_it_has() -> None:
    probe = ProbeResult("a", reachable=True, recorded=True)

    def why(record: HostRecord, drift: list[Any] = (), desired: str = "v1") -> list[str]:
        return decide.reasons(record, probe, list(drift), desired, NOW, 86400.0)

    assert why(converged()) == []
    assert why(converged(), [FILE_DRIFT]) == ["drift"]
    assert why(converged(), desired="v2") == ["desired state changed"]
    assert why(converged(consecutive_failures=1)) == ["failed last time"]
    assert why(converged(rollout_phase=RolloutPhase.QUEUED)) == ["rollout queued"]
    assert why(converged(last_full_check=None)) == ["full check due"]
    assert why(HostRecord("a")) == ["not in the state"]
    unrecorded = ProbeResult("a", reachable=True, recorded=False)
    assert decide.reasons(HostRecord("a"), unrecorded, [], "v1", NOW, 86400.0) == [
        "no record",
        "first run",
    ]


# -- before and after the plan ------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "why", "verdict"),
    [
        (converged(drift=[FILE_DRIFT]), ["drift"], Triage.APPLY),
        (converged(drift=[DRIVER_DRIFT]), ["drift"], Triage.PLAN),
        (converged(drift=[FILE_DRIFT]), ["drift", "desired state changed"], Triage.PLAN),
        (HostRecord("a"), ["no record", "first run"], Triage.PLAN),
        (HostRecord("a"), ["not in the state"], Triage.PLAN),
        (converged(rollout_phase=RolloutPhase.HALTED), ["rollout halted"], Triage.HALTED),
        (
            converged(rollout_phase=RolloutPhase.DRAINED, rollout_target="v1"),
            ["rollout drained"],
            Triage.ROLL_AS_PLANNED,
        ),
        (
            converged(rollout_phase=RolloutPhase.QUEUED, rollout_target="v0"),
            ["rollout queued"],
            Triage.PLAN,
        ),
    ],
    ids=[
        "file-drift",
        "driver-drift",
        "changed",
        "first-contact",
        "lost-state",
        "halted",
        "rolling",
        "retargeted",
    ],
)
def test_triage_before_the_plan(record: HostRecord, why: list[str], verdict: Triage) -> None:
    assert decide.triage(record, why, "v1", check_only=False) == verdict


def test_check_only_plans_every_candidate() -> None:
    record = converged(rollout_phase=RolloutPhase.HALTED, drift=[FILE_DRIFT])
    assert decide.triage(record, ["drift"], "v1", check_only=True) == Triage.PLAN


def test_after_the_plan_a_disruptive_change_rolls_and_a_harmless_one_applies() -> None:
    why = ["desired state changed"]
    rolled = decide.after_plan(
        converged(), run("driver", disruptive=True), why, "v2", ["driver"], False
    )
    assert rolled.next == Next.ROLL
    applied = decide.after_plan(converged(), run("toolkit"), why, "v2", ["toolkit"], False)
    assert applied.next == Next.APPLY
    checked = decide.after_plan(converged(), run("toolkit"), why, "v2", ["toolkit"], True)
    assert (checked.next, checked.needs_apply) == (Next.RECORD, True)
    nothing = decide.after_plan(converged(), run(), ["full check due"], "v1", [], False)
    assert (nothing.next, nothing.needs_apply) == (Next.RECORD, False)
    # Nothing of a stage to change, but the node's record would be written anew.
    stale = run(record_changed=True)
    stale_record = decide.after_plan(converged(), stale, ["failed last time"], "v1", [], False)
    assert stale_record.next == Next.APPLY


def test_a_failed_plan_repairs_file_drift_without_one_but_not_driver_drift() -> None:
    broken = HostRun("a", failures=["apt: sources list is broken"])
    files = converged(drift=[FILE_DRIFT])
    assert decide.after_plan(files, broken, ["drift"], "v1", [], False).next == Next.REPAIR
    driver = converged(drift=[DRIVER_DRIFT])
    assert decide.after_plan(driver, broken, ["drift"], "v1", [], False).next == Next.FAIL
    assert "may disrupt the node" in decide.why_not_repaired(driver)
    assert decide.after_plan(files, broken, ["drift"], "v1", [], True).next == Next.FAIL


def test_a_queued_host_with_nothing_left_to_change_leaves_its_rollout() -> None:
    queued = converged(rollout_phase=RolloutPhase.QUEUED, rollout_target="v1")
    verdict = decide.after_plan(queued, run(), ["rollout queued"], "v1", [], False)
    assert (verdict.next, verdict.leave_rollout) == (Next.RECORD, True)
    drained = converged(rollout_phase=RolloutPhase.DRAINED, rollout_target="v0")
    verdict = decide.after_plan(drained, run(), ["rollout drained"], "v1", [], False)
    assert (verdict.next, verdict.leave_rollout) == (Next.ROLL, False), "brought back in service"


# -- status and failures ---------------------------------------------------------------


def test_host_status_is_decided_in_one_place() -> None:
    record = converged()
    assert decide.host_status(Situation.SETTLED, record) == HostStatus.CONVERGED
    gpu_less = converged(stages=dict.fromkeys(STAGES, "not-a-gpu-node"))
    assert decide.host_status(Situation.SETTLED, gpu_less) == HostStatus.NOT_A_GPU_NODE
    assert decide.host_status(Situation.PENDING, record) == HostStatus.DRIFTED
    assert decide.host_status(Situation.REFUSED, record) == HostStatus.REFUSED
    assert decide.host_status(Situation.EXCLUDED, record) == HostStatus.EXCLUDED
    assert decide.host_status(Situation.RAN, record, run()) == HostStatus.CONVERGED
    reboot = run()
    reboot.stages["driver"]["status"] = "reboot-required"
    assert decide.host_status(Situation.FAILED, record, reboot) == HostStatus.REBOOT_REQUIRED
    broken = run()
    broken.stages["toolkit"]["status"] = "failed"
    assert decide.host_status(Situation.FAILED, record, broken) == HostStatus.FAILED
    lost = HostRun("a", reachable=False, failures=["gone"])
    assert decide.host_status(Situation.FAILED, record, lost) == HostStatus.UNREACHABLE


def test_failures_back_off_and_quarantine_but_never_for_a_reboot() -> None:
    fourth = converged(consecutive_failures=4)
    failure = decide.failure(fourth, "toolkit", "it broke", HostStatus.FAILED, 120.0, 5)
    assert (failure.consecutive, failure.quarantine, failure.action) == (5, True, Action.FAILED)
    assert failure.message == "toolkit: it broke; next attempt in 120 s (quarantined)"
    waiting = decide.failure(fourth, "driver", "reboot", HostStatus.REBOOT_REQUIRED, 60.0, 5)
    assert (waiting.quarantine, waiting.action) == (False, Action.WAITING)
    lost = decide.failure(converged(), "unreachable", "no route", HostStatus.FAILED, 60.0, 5)
    assert (lost.status, lost.quarantine) == (HostStatus.UNREACHABLE, False)


def test_backoff_doubles_up_to_its_cap() -> None:
    settings = Settings(jitter=0.0, backoff_base=60.0, backoff_cap=200.0)
    delays = [decide.backoff_delay(n, settings, random.Random(1)) for n in (1, 2, 3, 4)]
    assert delays == [60.0, 120.0, 200.0, 200.0]


# -- rollouts ------------------------------------------------------------------------------


def pool(**phases: RolloutPhase | None) -> dict[str, HostRecord]:
    return {h: converged(rollout_phase=p, rollout_pool="all") for h, p in phases.items()}


def test_a_batch_starts_within_the_pools_budget() -> None:
    members = pool(a=RolloutPhase.QUEUED, b=RolloutPhase.QUEUED, c=RolloutPhase.QUEUED)
    rollout = RolloutRecord("all", started=NOW)
    plan = decide.next_batch(["a", "b", "c"], members, RolloutPolicy(2, 2), rollout, NOW, None)
    assert (plan.why, plan.start, plan.rest) == ("", ("a", "b"), ("c",))


@pytest.mark.parametrize(
    ("phases", "policy", "last_batch", "applying", "why"),
    [
        ({"c": RolloutPhase.APPLYING}, RolloutPolicy(), None, ["c"], "waits for its batch"),
        ({"c": RolloutPhase.HALTED}, RolloutPolicy(), None, None, "halted by c"),
        ({}, RolloutPolicy(pause=600.0), NOW - 60, None, "the next in 540 s"),
        ({"c": RolloutPhase.DRAINED}, RolloutPolicy(), None, None, "1 host(s) out of service"),
    ],
    ids=["applying", "halted", "pause", "budget"],
)
def test_a_batch_waits_and_says_why(
    phases: dict[str, RolloutPhase],
    policy: RolloutPolicy,
    last_batch: float | None,
    applying: list[str] | None,
    why: str,
) -> None:
    members = pool(a=RolloutPhase.QUEUED, **phases)
    rollout = RolloutRecord("all", started=NOW, last_batch=last_batch)
    plan = decide.next_batch(["a"], members, policy, rollout, NOW, applying)
    assert why in plan.why
    assert plan.start == ()
    assert plan.wake_at == (NOW + 540 if policy.pause else None)


def test_hosts_already_out_of_service_go_first() -> None:
    records = pool(a=RolloutPhase.QUEUED, b=RolloutPhase.DRAINED)
    assert decide.rollout_queue(["a", "b"], records) == ["b", "a"]


@pytest.mark.parametrize(
    ("slurm", "waited", "step"),
    [
        ({"managed": False}, 0.0, SlurmNext.UNMANAGED),
        ({"managed": True, "jobs": []}, 0.0, SlurmNext.DRAINED),
        ({"managed": True, "jobs": [7]}, 10.0, SlurmNext.WAIT),
        ({"managed": True, "jobs": [7]}, 4000.0, SlurmNext.HALT),
        ({}, 0.0, SlurmNext.HALT),
    ],
    ids=["not-slurm", "idle", "jobs", "timeout", "no-answer"],
)
def test_a_slurm_drain_answer(slurm: dict[str, Any], waited: float, step: SlurmNext) -> None:
    verdict = decide.slurm_step(HostRun("a", slurm=slurm), waited, 3600.0)
    assert verdict.next == step
    if step == SlurmNext.HALT and slurm:
        assert verdict.reason.startswith("Slurm job(s) 7 still running after 3600 s")
    if step == SlurmNext.WAIT:
        assert "drained in Slurm 10 s ago (waits up to 3600 s)" in verdict.reason


def test_a_drain_refused_by_a_disruption_budget_is_told_apart() -> None:
    assert decide.blocked_by_budget(
        "Cannot evict pod as it would violate the pod's disruption budget"
    )
    assert not decide.blocked_by_budget("connection refused")
